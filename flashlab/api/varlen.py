"""`varlen_attention`: attention over a packed batch of sequences of different lengths
(FlashAttention's ``flash_attn_varlen_func`` layout), forward and backward, GQA, causal and
sliding windows computed by skipping the key tiles outside the window.

Packing: the tokens of all sequences stored back to back, ``(total_tokens, heads, D)``, with
``cu_seqlens = [0, n_0, n_0 + n_1, …]`` (int32). A padded batch of B sequences padded to the
longest, N_max, computes B·N_max² scores per head; packed, only Σ_b n_b² (within each sequence).
The kernels are in `flashlab.kernels.varlen`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flashlab.kernels.constants import LOG2E  # the kernels' lse is base 2
from flashlab.kernels.dense import flash_backward_preprocess_kernel
from flashlab.kernels.varlen import varlen_backward_dkdv_kernel, varlen_backward_dq_kernel, varlen_forward_kernel
from flashlab.launch import autotune
from flashlab.launch.dense import KERNEL_DTYPES, MAX_HEAD_DIM, PREPROCESS_BLOCK, cdiv, head_dim_args
from flashlab.launch.runtime import input_precision
from flashlab.launch.spec import AttentionSpec
from flashlab.reference.checks import check_softcap, check_window, default_scale, finite_number, without_neg_views
from flashlab.reference.first_order import first_order_only
from flashlab.reference.naive import soft_cap

from .attention import _autocast_inputs, _autocasting
from .decode import band, launch


def varlen_block_sizes(device_is_gpu: bool, head_dim: int) -> dict[str, dict]:
    """Tile sizes and launch options per kernel. On a GPU: the default (first) configuration of
    `flashlab.launch.autotune` for this GPU generation and head dimension, the tiles the tuner ranks
    first for the dense kernels of notebooks 05-06. In the interpreter: 16×16 tiles (its cost is per
    op; small tiles also show the skipping)."""
    if not device_is_gpu:
        tiles = dict(BLOCK_M=16, BLOCK_N=16)
        return {"forward": tiles, "dkdv": tiles, "dq": tiles}
    capability = torch.cuda.get_device_capability()
    return {kernel: autotune.candidates(kernel, head_dim, capability)[0].kwargs() for kernel in autotune.KERNELS}


def key_tile_range(first_query: int, last_query: int, q_len: int, k_len: int, left: int, right: int,
                   block_n: int) -> tuple[int, int]:
    """The key range [lo, hi) the kernels loop over for query rows first_query..last_query of one
    sequence: lo is the first key the band reaches rounded down to a tile start, hi one past
    the last key it reaches (Python mirror of the kernels' loop bounds, for plots and tests)."""
    shift = k_len - q_len
    lo = max(0, first_query + shift - left) // block_n * block_n
    hi = min(k_len, last_query + shift + right + 1)
    return lo, max(lo, hi)


def cu_seqlens_from_lengths(lengths, device=None) -> torch.Tensor:
    """[0, n_0, n_0 + n_1, …]: where each packed sequence starts (int32, batch + 1 entries).
    ``lengths``: a 1-D sequence of whole numbers ≥ 0 (a list, or an integer tensor)."""
    given = torch.as_tensor(lengths, device=device)
    if given.numel() == 0 and given.dim() == 1:
        given = given.to(torch.int64)                 # [] is float32 to torch: no sequences
    if given.dim() != 1 or given.is_floating_point() or given.is_complex() or given.dtype == torch.bool:
        raise ValueError(f"lengths: expected a 1-D sequence of whole numbers, got {given.dtype} of shape "
                         f"{tuple(given.shape)}; pass e.g. [len(s) for s in sequences].")
    if given.numel() and int(given.min()) < 0:
        first = int((given < 0).nonzero()[0, 0])
        raise ValueError(f"lengths: entry {first} is {int(given[first])}; a sequence has 0 or more tokens.")
    return torch.nn.functional.pad(given.to(torch.int64).cumsum(0), (1, 0)).to(torch.int32)


def _fail(argument: str, problem: str, fix: str) -> None:
    raise ValueError(f"{argument}: {problem}. {fix}")


def _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window,
                         contents=True):
    """Shapes, dtypes, devices and options always; the values of cu_seqlens only with ``contents``
    (an eager call: a traced one cannot read them, and its graph would hold them as constants)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            _fail(name, f"expected a 3-D tensor (total_tokens, heads, D), got "
                  f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}",
                  "Pack the sequences back to back: x.flatten(0, 1) of a (batch, N, heads, D) tensor, "
                  "then drop the padding rows.")
        if t.dtype not in KERNEL_DTYPES:
            _fail(name, f"dtype {t.dtype} is not supported", "Use float16, bfloat16 or float32.")
        if t.dtype != q.dtype or t.device != q.device:
            _fail(name, f"is {t.dtype} on {t.device}, q is {q.dtype} on {q.device}",
                  f"Use one dtype and device, e.g. {name}.to(q).")
    if k.shape != v.shape:
        _fail("v", f"shape {tuple(v.shape)} differs from k's {tuple(k.shape)}", "k and v need one row per key.")
    if k.shape[2] != q.shape[2]:
        _fail("k", f"head dimension {k.shape[2]} differs from q's {q.shape[2]}", "Use equal head dimensions.")
    if q.shape[2] > MAX_HEAD_DIM:
        _fail("q", f"head dimension {q.shape[2]} is not in 1..{MAX_HEAD_DIM}", "Split the heads.")
    if q.shape[2] == 0:
        _fail("q", "head dimension 0", "Pass at least one feature per head.")
    if q.shape[1] == 0 or k.shape[1] == 0:
        _fail("k" if q.shape[1] else "q", f"has no heads (q {q.shape[1]}, k {k.shape[1]})",
              "Pass at least one head in q and in k, v.")
    if q.shape[1] % k.shape[1]:
        _fail("k", f"has {k.shape[1]} heads, which does not divide q's {q.shape[1]}",
              "Grouped-query attention needs the kv heads to divide the q heads.")
    for name, cu, total, max_len in (("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q),
                                     ("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 1:
            _fail(name, f"expected a 1-D int32 tensor (batch + 1,), got "
                  f"{getattr(cu, 'dtype', type(cu).__name__)} {tuple(getattr(cu, 'shape', ()))}",
                  "Build it with flashlab.api.varlen.cu_seqlens_from_lengths(lengths).")
        if cu.device != q.device:
            _fail(name, f"is on {cu.device} but q is on {q.device}", f"Move it with {name}.to(q.device).")
        name_max = "max_seqlen_q" if name.endswith("q") else "max_seqlen_k"
        if isinstance(max_len, bool) or not isinstance(max_len, (int, torch.SymInt)):
            _fail(name_max, f"expected a Python int, got {type(max_len).__name__} {max_len!r}",
                  f"Pass int({name_max}), the length of the longest sequence.")
        if not contents:
            continue
        values = cu.tolist()
        lengths = [b - a for a, b in zip(values[:-1], values[1:])]
        if values[0] != 0 or values[-1] != total or any(n < 0 for n in lengths):
            falls = next((i for i, n in enumerate(lengths) if n < 0), None)      # one entry, not the batch
            got = (f"starts at {values[0]}" if values[0] != 0 else
                   f"falls from {values[falls]} to {values[falls + 1]} at entry {falls + 1}" if falls is not None
                   else f"ends at {values[-1]}")
            _fail(name, f"must rise from 0 to the {total} packed tokens, but it {got}",
                  "cu_seqlens[b] is where sequence b starts; cu_seqlens[-1] the total number of tokens.")
        if max_len < max(lengths, default=0):
            _fail(name_max, f"{max_len!r} is smaller than the longest sequence, {max(lengths, default=0)}",
                  "Pass the length of the longest sequence (the grid is sized by it).")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        _fail("cu_seqlens_k", f"describes {cu_seqlens_k.numel() - 1} sequences, cu_seqlens_q "
              f"{cu_seqlens_q.numel() - 1}", "Give both one entry per sequence, plus one.")
    if scale is not None and not finite_number(scale):       # any finite scale, as FlashAttention's
        _fail("scale", f"expected a finite number or None, got {scale!r}", "Leave it None for 1/sqrt(D).")
    check_window(window)


def _kernel_args(spec: AttentionSpec, max_q: int, max_k: int) -> tuple[tuple, dict]:
    """The spec as the varlen kernels take it: (qk_scale, softcap, left, right) in base 2, the band
    per sequence (`band`), and the flags."""
    (qk_scale, softcap, _, _), flags = spec.kernel_args(max_q, max_k)
    return (qk_scale, softcap, *band(spec.is_causal, spec.window, max_q, max_k)), dict(
        SOFTCAP=flags["SOFTCAP"], INPUT_PRECISION=spec.precision)


def varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, spec: AttentionSpec):
    """The forward kernel alone: O (total_q, heads, D) and L (heads, total_q), base 2."""
    heads, head_dim = q.shape[1], q.shape[2]
    batch = cu_q.numel() - 1
    blocks = varlen_block_sizes(q.device.type == "cuda", head_dim)["forward"]
    # contiguous whatever q's strides: the backward's preprocess reads O with its head dimension
    # contiguous (empty_like kept q's strides, and a q whose D had stride 2 gave wrong dq and dk)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(heads, q.shape[0], dtype=torch.float32, device=q.device)
    scalars, flags = _kernel_args(spec, max_q, max_k)
    num_m = cdiv(max_q, blocks["BLOCK_M"])
    if num_m * batch:
        launch(varlen_forward_kernel, (num_m * batch * heads,),
               q, k, v, cu_q, cu_k, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), lse.stride(0),
               heads, heads // k.shape[1], head_dim, num_m, q.shape[0], k.shape[0], *scalars,
               BLOCK_D=head_dim_args(head_dim)["BLOCK_D"], **flags, **blocks)
    return out, lse


def varlen_backward(q, k, v, out, lse, grad_out, cu_q, cu_k, max_q, max_k, spec: AttentionSpec):
    """D = rowsum(dO ∘ O) (notebook 06's preprocess kernel, the packed batch read as one
    sequence), then the dK/dV pass and the dQ pass. Returns (dq, dk, dv)."""
    heads, heads_k, head_dim = q.shape[1], k.shape[1], q.shape[2]
    batch, total_q = cu_q.numel() - 1, q.shape[0]
    gpu = q.device.type == "cuda"
    blocks = varlen_block_sizes(gpu, head_dim)
    block_d = head_dim_args(head_dim)["BLOCK_D"]
    grad_out = grad_out.contiguous() if grad_out.stride(-1) != 1 else grad_out
    delta = torch.empty(heads, total_q, dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)   # empty sequences: 0
    if total_q:
        rows = PREPROCESS_BLOCK[gpu]
        launch(flash_backward_preprocess_kernel, (cdiv(total_q, rows) * heads,),
               out, grad_out, delta, 0, out.stride(1), out.stride(0),      # head dim contiguous
               0, grad_out.stride(1), grad_out.stride(0), heads, total_q, head_dim,
               BLOCK_M=rows, BLOCK_D=block_d)
    strides = (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), lse.stride(0))
    (qk_scale, softcap, left, right), flags = _kernel_args(spec, max_q, max_k)
    num_n = cdiv(max_k, blocks["dkdv"]["BLOCK_N"])
    if num_n * batch:
        launch(varlen_backward_dkdv_kernel, (num_n * batch * heads_k,),
               q, k, v, grad_out, lse, delta, cu_q, cu_k, dk, dv, *strides, *dk.stride(), *dv.stride(),
               heads_k, heads // heads_k, head_dim, num_n, total_q, k.shape[0], qk_scale, spec.scale, softcap, left,
               right,
               BLOCK_D=block_d, **flags, **blocks["dkdv"])
    num_m = cdiv(max_q, blocks["dq"]["BLOCK_M"])
    if num_m * batch:
        launch(varlen_backward_dq_kernel, (num_m * batch * heads,),
               q, k, v, grad_out, lse, delta, cu_q, cu_k, dq, *strides, *dq.stride(),
               heads, heads // heads_k, head_dim, num_m, total_q, k.shape[0], qk_scale, spec.scale, softcap, left,
               right,
               BLOCK_D=block_d, **flags, **blocks["dq"])
    return dq, dk, dv


# -- the custom ops ------------------------------------------------------------------------------
# torch.compile and torch.export see a call as one node of each (cu_seqlens' values are read only inside,
# where the tensors are real); eager calls skip the dispatcher through `EagerVarlenAttention`:
#
#     flashlab::varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, window_left, window_right,
#                              softcap, input_precision) -> (out, lse)
#     flashlab::varlen_backward(grad_out, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, <the same options>)
#                              -> (dq, dk, dv)
#
# The options are an `AttentionSpec`'s fields as plain numbers (window −1, −1: none; softcap 0: none);
# lse is base 2, (heads, total_q) fp32. CPU tensors: the interpreted kernels (fp16/bf16 computed in fp32),
# or `varlen_by_sequence` beyond the interpreter's tile limit (the backward then differentiates it again).


def _spec(is_causal, scale, window_left, window_right, softcap, precision) -> AttentionSpec:
    return AttentionSpec.from_op(0.0, is_causal, scale, precision, window_left, window_right, softcap)


def _fp32_on_cpu(q, *tensors):
    """The interpreter's fp16/bf16 arithmetic is not the GPU's (bf16 sums come out wrong): half-precision CPU
    tensors are computed in fp32, as flashlab.attention does on the CPU (flashlab.api.ops)."""
    if not q.is_cpu or q.dtype == torch.float32:
        return tensors
    return tuple(t.float() for t in tensors)


def _same_layout(result, like):
    """``result`` in ``torch.empty_like(like)``'s layout and dtype, the one the fake impls promise."""
    if result.dtype == like.dtype and result.stride() == like.stride():
        return result
    return torch.empty_like(like).copy_(result)


def varlen_forward_impl(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
                        is_causal: bool, scale: float, window_left: int, window_right: int, softcap: float,
                        input_precision: str) -> tuple[Tensor, Tensor]:
    """The forward op's body: (O (total_q, heads, D) contiguous in q's dtype, L (heads, total_q) base 2)."""
    spec = _spec(is_causal, scale, window_left, window_right, softcap, input_precision)
    # the kernels read cu_seqlens[b] with no stride: a strided view (cu[::2], pairs[:, 0]) read as it
    # lies in memory gave other sequences' bounds, and reads past its end
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    qc, kc, vc = _fp32_on_cpu(q, q, k, v)
    if q.is_cpu and not _interpreted_kernels_take(q, k, cu_q, cu_k):
        # as flashlab.attention on a CPU: the PyTorch path (fp32, one sequence at a time) for calls too large
        # for the interpreter, or for every call with FLASHLAB_CPU_KERNELS=0
        out, lse = varlen_by_sequence(qc, kc, vc, cu_q, cu_k, is_causal, scale, spec.window, torch.float32, softcap,
                                      with_lse=True)
        lse = lse * LOG2E
    else:
        out, lse = varlen_forward(qc, kc, vc, cu_q, cu_k, max_q, max_k, spec)
    return out.to(q.dtype).contiguous(), lse


def varlen_backward_impl(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_q: Tensor,
                         cu_k: Tensor, max_q: int, max_k: int, is_causal: bool, scale: float, window_left: int,
                         window_right: int, softcap: float, input_precision: str) -> tuple[Tensor, Tensor, Tensor]:
    """The backward op's body: (dq, dk, dv) laid out as q, k, v."""
    spec = _spec(is_causal, scale, window_left, window_right, softcap, input_precision)
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    qc, kc, vc, oc, gc = _fp32_on_cpu(q, q, k, v, out, grad_out)
    if q.is_cpu and not _interpreted_kernels_take(q, k, cu_q, cu_k):
        grads = _backward_by_sequence(qc, kc, vc, gc, cu_q, cu_k, spec)
    else:
        grads = varlen_backward(qc, kc, vc, oc, lse, gc, cu_q, cu_k, max_q, max_k, spec)
    return tuple(_same_layout(g, t) for g, t in zip(grads, (q, k, v)))


def _backward_by_sequence(q, k, v, grad_out, cu_q, cu_k, spec: AttentionSpec):
    """The PyTorch path's gradients in fp32, one sequence at a time, written out (an op's body runs below
    autograd, so `varlen_by_sequence` cannot be differentiated there), notebook 04's backward:
        P = softmax(S),  dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − rowsum(dP ∘ P)),
        dS ∘= 1 − tanh²(x/cap) under a soft cap,  dQ = dS K·scale,  dK = dSᵀ Q·scale
    with each kv head's gradient summed over its group of q heads."""
    heads, heads_k = q.shape[1], k.shape[1]
    group = heads // heads_k
    left, right = band(spec.is_causal, spec.window, q.shape[0], k.shape[0])
    dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in (q, k, v))
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        qb = q[rows].float().transpose(0, 1)                                      # (heads, Lq, D)
        kb = k[keys].float().repeat_interleave(group, 1).transpose(0, 1)
        vb = v[keys].float().repeat_interleave(group, 1).transpose(0, 1)
        gb = grad_out[rows].float().transpose(0, 1)
        n_q, n_k = qb.shape[1], kb.shape[1]
        rel = torch.arange(n_k, device=q.device)[None, :] - torch.arange(n_q, device=q.device)[:, None] - (n_k - n_q)
        keep = (rel >= -left) & (rel <= right)
        raw = qb @ kb.transpose(-1, -2) * spec.scale
        scores = soft_cap(raw, spec.softcap)
        p = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)   # empty rows: 0
        dp = gb @ vb.transpose(-1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        if spec.softcap:
            ds = ds * (1 - torch.tanh(raw / spec.softcap) ** 2)
        dq[rows] = (ds @ kb * spec.scale).transpose(0, 1)
        dk[keys] = (ds.transpose(-1, -2) @ qb * spec.scale).unflatten(0, (heads_k, group)).sum(1).transpose(0, 1)
        dv[keys] = (p.transpose(-1, -2) @ gb).unflatten(0, (heads_k, group)).sum(1).transpose(0, 1)
    return dq, dk, dv


varlen_forward_op = torch.library.custom_op("flashlab::varlen_forward", mutates_args=())(varlen_forward_impl)
varlen_backward_op = torch.library.custom_op("flashlab::varlen_backward", mutates_args=())(varlen_backward_impl)


@varlen_forward_op.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, window_left, window_right, softcap, input_precision):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), q.new_empty(q.shape[1], q.shape[0],
                                                                               dtype=torch.float32)


@varlen_backward_op.register_fake
def _(grad_out, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, is_causal, scale, window_left, window_right, softcap,
      input_precision):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class VarlenAttentionFunction:
    """The forward op's autograd formula (``register_autograd``): saves q, k, v, O, the log-sum-exp and
    cu_seqlens; the backward recomputes P tile by tile (the backward op, or its body when eager)."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, cu_q, cu_k, *options = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.options = options

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        args = (grad_out, q, k, v, out, lse, cu_q, cu_k, *ctx.options)
        if type(grad_out) is torch.Tensor and type(q) is torch.Tensor:          # eager: the body, no dispatcher
            # a second derivative raises, never drops (flashlab/reference/first_order.py)
            grads = first_order_only(varlen_backward_impl(*args), (q, k, v))
        else:                                                                 # traced: the op
            grads = torch.ops.flashlab.varlen_backward(*args)
        return *grads, *(None,) * (len(ctx.needs_input_grad) - 3)


class EagerVarlenAttention(torch.autograd.Function):
    """The op's forward and backward for eager calls on real tensors (no dispatcher), as
    `flashlab.api.ops.EagerFlashAttention` is `flashlab.attention`'s."""

    @staticmethod
    def forward(ctx, *inputs):
        out, lse = varlen_forward_impl(*inputs)
        ctx.set_materialize_grads(False)
        VarlenAttentionFunction.setup_context(ctx, inputs, (out, lse))
        return out, lse

    backward = staticmethod(VarlenAttentionFunction.backward)


varlen_forward_op.register_autograd(VarlenAttentionFunction.backward,
                                    setup_context=VarlenAttentionFunction.setup_context)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, is_causal=False, scale=None,
                     window=None, softcap=None, exact_fp32=False):
    """Attention within each sequence of a packed batch (FlashAttention's ``flash_attn_varlen_func``).

    Every option after the sizes is keyword-only: FlashAttention's eighth positional argument is
    ``dropout_p``, and ``varlen_attention(q, k, v, cu, cu, L, L, 0.1)`` raises TypeError instead of
    running with some other option set to 0.1. `flashlab.flash_attn_interface.flash_attn_varlen_func`
    takes FlashAttention's own signature.

    Args:
        q: ``(total_q, heads, D)``; k, v: ``(total_k, heads_k, D)`` with heads_k dividing heads (GQA:
            q head h reads kv head h // (heads / heads_k)). float16 / bfloat16 / float32.
        cu_seqlens_q, cu_seqlens_k: int32 ``(batch + 1,)``: sequence b is rows cu[b]..cu[b+1]−1.
            Empty sequences are allowed (their rows, if any, are zeros).
        max_seqlen_q, max_seqlen_k: the longest sequence's length (sizes the grid).
        is_causal: query i sees keys j ≤ i + Lk − Lq (the diagonal aligned to the end of the keys,
            FlashAttention's convention; top-left and bottom-right agree when Lq = Lk).
        scale: default 1/sqrt(D).
        window: ``(left, right)``: query i sees keys i + Lk − Lq − left … i + Lk − Lq + right; −1 is
            unbounded on that side; ``(w, 0)`` with causal is a sliding window of w keys before
            each query. Tiles outside the window are skipped, forward and backward.
        softcap: the logits soft-capped, cap·tanh(x/cap), before the causal mask and window
            (Gemma 2's); None for none.
        exact_fp32: float32 inputs multiply exactly instead of in TF32 (on the GPU).

    Returns:
        ``(total_q, heads, D)``; a query with no key to attend to gives zeros (and zero gradients).

    On a CPU the kernels run in Triton's interpreter, as `flashlab.attention`'s do, up to its tile
    limit; larger calls, and every call with ``FLASHLAB_CPU_KERNELS=0``, take `varlen_by_sequence`
    (PyTorch, fp32, one sequence at a time). The kernels are the custom ops ``flashlab::varlen_forward``
    and ``flashlab::varlen_backward``: ``torch.compile(fullgraph=True)`` and ``torch.export`` capture a
    call as one node (cu_seqlens' values are then not checked: the graph cannot read them). Under
    ``torch.autocast`` q, k, v are cast to autocast's dtype, as SDPA's are. Inside ``torch.func``
    transforms (vmap, grad) and ``torch.jit.trace`` the call runs `varlen_by_sequence` in q's dtype.
    """
    compiling = torch.compiler.is_compiling()
    transformed = not compiling and (torch._C._are_functorch_transforms_active() or torch._C._is_tracing())
    eager = type(q) is torch.Tensor and not compiling and not transformed
    if isinstance(q, torch.Tensor) and _autocasting(q):          # as flashlab.attention and SDPA under autocast
        q, k, v, _ = _autocast_inputs(q, k, v, None)
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window,
                         contents=not compiling)
    softcap = check_softcap(softcap)
    window = _window_or_none(window)
    if transformed:
        # inside torch.func (vmap, grad…) or torch.jit.trace: plain PyTorch operations, which those understand
        return varlen_by_sequence(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, window, q.dtype, softcap)
    spec = AttentionSpec(default_scale(q.shape[-1], scale), is_causal, window, softcap,
                         precision=input_precision(q.dtype, q.device, exact_fp32))
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, spec.scale,
            *spec.window_args, spec.softcap, spec.precision)
    if not eager:                                               # traced (compile, export): the custom op
        return torch.ops.flashlab.varlen_forward(*args)[0]
    q, k, v = without_neg_views(q, k, v)                # the kernels read storage
    args = (q, k, v, *args[3:])
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return EagerVarlenAttention.apply(*args)[0]
    return varlen_forward_impl(*args)[0]


def _interpreted_kernels_take(q, k, cu_seqlens_q, cu_seqlens_k) -> bool:
    """A CPU call: whether the kernels run (in Triton's interpreter) rather than `varlen_by_sequence`,
    by the rule of `flashlab.attention`: ``FLASHLAB_CPU_KERNELS`` unset or 1, and at most
    ``INTERPRETER_MAX_TILES`` 32 × 32 tiles over every sequence and head (windows not counted off)."""
    from flashlab.launch.interpreter_notice import INTERPRETER_BLOCK

    from .attention import interpreted_tiles_allowed
    lengths_q, lengths_k = cu_seqlens_q.diff().tolist(), cu_seqlens_k.diff().tolist()
    tiles = q.shape[1] * sum(cdiv(a, INTERPRETER_BLOCK) * cdiv(b, INTERPRETER_BLOCK)
                             for a, b in zip(lengths_q, lengths_k))
    return interpreted_tiles_allowed(tiles)


def _window_or_none(window):
    return None if window is None or tuple(window) == (-1, -1) else (int(window[0]), int(window[1]))


def reference_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal=False, scale=None, window=None,
                               softcap=None):
    """The ground truth in float64, one sequence at a time, with the window as an explicit
    mask over all (query, key) pairs (differentiable, for gradient references)."""
    return varlen_by_sequence(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, window, torch.float64,
                              check_softcap(softcap))


def varlen_by_sequence(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, window, dtype,
                       softcap=0.0, with_lse=False):
    """Attention one sequence at a time in plain PyTorch, computed in ``dtype`` and returned in it: the
    float64 reference, and (fp32) `varlen_attention`'s PyTorch path on a CPU. Differentiable; an
    Lq × Lk score matrix per head of each sequence at a time. ``with_lse``: also the natural-log
    log-sum-exp (heads, total_q) fp32, −inf for a row with no key."""
    scale = default_scale(q.shape[-1], scale)
    group = q.shape[1] // k.shape[1]
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    left, right = band(is_causal, window, q.shape[0], k.shape[0])
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qb = q[cq[b]:cq[b + 1]].to(dtype).transpose(0, 1)                         # (heads, Lq, D)
        kb = k[ck[b]:ck[b + 1]].to(dtype).repeat_interleave(group, 1).transpose(0, 1)
        vb = v[ck[b]:ck[b + 1]].to(dtype).repeat_interleave(group, 1).transpose(0, 1)
        n_q, n_k = qb.shape[1], kb.shape[1]
        rel = torch.arange(n_k, device=q.device)[None, :] - torch.arange(n_q, device=q.device)[:, None] - (n_k - n_q)
        keep = (rel >= -left) & (rel <= right)
        scores = soft_cap(qb @ kb.transpose(-1, -2) * scale, softcap)
        scores = scores.masked_fill(~keep, float("-inf"))
        weights = torch.softmax(scores, -1).masked_fill(~keep, 0.0)                # empty rows: 0, not NaN
        outs.append((weights @ vb).transpose(0, 1))
        if with_lse:
            lses.append(torch.logsumexp(scores, -1).float())
    out = torch.cat(outs) if outs else q.to(dtype) * 0
    if not with_lse:
        return out
    return out, (torch.cat(lses, -1) if lses else q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32))
