"""flashlab: FlashAttention built step by step, from einsum to Triton.

The package the FlashLab course builds. Public API so far:

- `naive_attention`: attention from two einsums and a softmax.
- `reference_attention`, `rel_error`, `max_abs_error`, `assert_close`, `TOLERANCE`:
  the float64 ground truth and the error metrics every test uses.
- `predict_naive_attention_memory`, `measure_peak_memory`, `largest_seq_len`:
  the memory model of naive attention and its measurement.
- `online_softmax`, `tiled_attention`: FlashAttention's algorithm in PyTorch
  (streaming softmax state and merge; tiled forward and recomputing backward).
- `fused_softmax`: a fused row-softmax Triton kernel.
- `attention`, `MultiHeadAttention`: FlashAttention in Triton (forward, backward, masks,
  GQA, dropout) as a drop-in for ``torch.nn.functional.scaled_dot_product_attention``;
  `attention_qkvpacked`: the same on one (B, N, 3, H, D) projection, its gradient in that layout;
  `flashlab.ops`: its kernels as torch custom ops (torch.compile, torch.export);
  `flashlab.runtime`: compiled (CUDA tensors) or interpreted (CPU tensors) kernels, per call.
- `flashlab.traffic`: HBM traffic models; `flashlab.instrument`: counters for tiled runs.
- `flashlab.autotune`: candidate block sizes per GPU generation, and the autotuner that picks one per shape.
- `decode_attention`: new query tokens against a KV cache, contiguous or paged, split over the keys
  (flash-decoding); `varlen_attention`: packed sequences of different lengths (`cu_seqlens`), forward
  and backward, with sliding windows (notebook 10).
"""

# Nothing here imports Triton or sets anything process-wide: kernels are compiled or
# interpreted per call (flashlab.runtime), and Triton is imported when a kernel is first needed.
from . import autotune, runtime
from .checks import check_attention_inputs
from .flash_attention import InterpreterWarning, MultiHeadAttention, attention, attention_qkvpacked
from .memory import (
    MemoryMeasurement,
    NaiveAttentionMemory,
    format_bytes,
    largest_seq_len,
    measure_peak_memory,
    predict_naive_attention_memory,
)
from .naive import causal_keep_mask, naive_attention
from .online_softmax import SoftmaxState, online_softmax
from .reference import (
    TOLERANCE,
    assert_close,
    max_abs_error,
    reference_attention,
    reference_gradients,
    rel_error,
)
from .tiled import tiled_attention

if runtime.triton_available():
    # eager, not through __getattr__: once the submodule flashlab.fused_softmax is imported
    # (the benchmarks import it), the package attribute of that name would be the module
    from .fused_softmax import fused_softmax

__version__ = "0.1.0"


def __getattr__(name):
    # Triton-backed names load on first use, so `import flashlab` works without Triton.
    if name == "fused_softmax":
        runtime.require_triton("flashlab.fused_softmax")
    if name == "decode_attention":
        runtime.require_triton("flashlab.decode_attention")
        from .decode import decode_attention
        return decode_attention
    if name == "varlen_attention":
        runtime.require_triton("flashlab.varlen_attention")
        from .varlen import varlen_attention
        return varlen_attention
    raise AttributeError(f"module 'flashlab' has no attribute {name!r}")

__all__ = [
    "TOLERANCE",
    "SoftmaxState",
    "InterpreterWarning",
    "MultiHeadAttention",
    "attention",
    "attention_qkvpacked",
    "autotune",
    "MemoryMeasurement",
    "NaiveAttentionMemory",
    "assert_close",
    "causal_keep_mask",
    "check_attention_inputs",
    "decode_attention",
    "format_bytes",
    "fused_softmax",
    "largest_seq_len",
    "max_abs_error",
    "measure_peak_memory",
    "naive_attention",
    "online_softmax",
    "predict_naive_attention_memory",
    "reference_attention",
    "reference_gradients",
    "rel_error",
    "runtime",
    "tiled_attention",
    "varlen_attention",
]
