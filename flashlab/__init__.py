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
  `flashlab.api.ops`: its kernels as torch custom ops (torch.compile, torch.export);
  `flashlab.launch.runtime`: compiled (CUDA tensors) or interpreted (CPU tensors) kernels, per call.
- `flashlab.lessons.traffic`: HBM traffic models; `flashlab.lessons.instrument`: counters for tiled runs.
- `flashlab.launch.autotune`: candidate block sizes per GPU generation, and the autotuner that picks one per shape.
- `decode_attention`: new query tokens against a KV cache, contiguous or paged, split over the keys
  (flash-decoding); `varlen_attention`: packed sequences of different lengths (`cu_seqlens`), forward
  and backward, with sliding windows (notebook 10).
- `flashlab.flash_attn_interface`: FlashAttention 2's functions (``flash_attn_func``, ``…_varlen_func``,
  ``…_with_kvcache``…) with its names, defaults and layouts, on these kernels: porting is changing the import.
"""

# Nothing here imports Triton or sets anything process-wide: kernels are compiled or
# interpreted per call (flashlab.launch.runtime), and Triton is imported when a kernel is first needed.
from flashlab.api.attention import InterpreterWarning, MultiHeadAttention, attention, attention_qkvpacked
from flashlab.launch import autotune, runtime
from flashlab.lessons.memory import (
    MemoryMeasurement,
    NaiveAttentionMemory,
    format_bytes,
    largest_seq_len,
    measure_peak_memory,
    predict_naive_attention_memory,
)
from flashlab.reference.checks import check_attention_inputs
from flashlab.reference.float64 import (
    TOLERANCE,
    assert_close,
    max_abs_error,
    reference_attention,
    reference_gradients,
    rel_error,
)
from flashlab.reference.naive import causal_keep_mask, naive_attention
from flashlab.reference.online_softmax import SoftmaxState, online_softmax
from flashlab.reference.tiled import tiled_attention

if runtime.triton_available():
    # eager, not through __getattr__: once the submodule flashlab.lessons.fused_softmax is imported
    # (the benchmarks import it), the package attribute of that name would be the module
    from flashlab.lessons.fused_softmax import fused_softmax

__version__ = "0.1.0"


def __getattr__(name):
    # Triton-backed names load on first use, so `import flashlab` works without Triton.
    if name == "fused_softmax":
        runtime.require_triton("flashlab.lessons.fused_softmax")
    if name == "decode_attention":
        runtime.require_triton("flashlab.decode_attention")
        from flashlab.api.decode import decode_attention
        return decode_attention
    if name == "varlen_attention":
        runtime.require_triton("flashlab.varlen_attention")
        from flashlab.api.varlen import varlen_attention
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
