"""flashlab's attention kernels as PyTorch custom operators, so that ``torch.compile``
(``fullgraph=True``, any backend) and ``torch.export`` see one opaque node instead of
tracing into Triton's launcher:

    flashlab::flash_attention_forward(q, k, v, attn_mask?, dropout_p, seed?, is_causal, scale,
                                      input_precision, window_left=-1, window_right=-1,
                                      softcap=0.0) -> (out, lse)
    flashlab::flash_attention_backward(grad_out, q, k, v, out, lse, attn_mask?, dropout_p, seed?,
                                       is_causal, scale, input_precision, mask_grad,
                                       window_left=-1, window_right=-1, softcap=0.0) -> (dq, dk, dv, dmask)

and the same pair for q, k, v packed in one (B, N, 3, H, D) tensor (`layouts.unpack_qkv`), whose
backward returns one gradient in that layout: ``flash_attention_qkvpacked_forward`` / ``_backward``.

Shapes are the kernels' own: q ``(B, H, Nq, D)``, k/v ``(B, H_kv, Nk, D)``, a mask
broadcastable to ``(B, H, Nq, Nk)``; ``lse`` is the base-2 log-sum-exp per query (fp32),
``(B, H, Nq)``, or with a float mask ``(2, B, H, Nq)``: L, then each row's fix
(`flashlab.launch.dense.new_lse`). `flashlab.attention` validates and reshapes its inputs, then
calls these; nothing here validates again. The options are the fields of one
`flashlab.launch.spec.AttentionSpec` as plain numbers (a schema allows nothing else), rebuilt on
the other side: ``window_left``/``window_right`` are attention's ``window=(left, right)`` (−1:
unbounded; both −1: no window), ``softcap`` its logit soft-cap (0: none).

- The seed of dropout is a CPU int64 tensor drawn *outside* the op (`draw_seed`), so a
  compiled graph draws a fresh one per call and the backward replays the same mask.
- CUDA tensors run the compiled kernels (autotuned); CPU tensors their interpreted twins
  (`flashlab.launch.runtime.kernel_for`). The interpreter's bfloat16 and float16 arithmetic is not
  the GPU's (bf16 sums come out wrong by orders of magnitude), so on the CPU half-precision
  inputs are computed in fp32 and the results cast back.
- ``dmask`` is the gradient of a float ``attn_mask`` (dS summed over its broadcast
  dimensions, as SDPA gives it). The kernels do not produce dS, so it is recomputed here in
  PyTorch from the saved log-sum-exp: an Nq × Nk tensor per head, only when the mask
  requires grad. Otherwise ``dmask`` is an empty tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flashlab.kernels.constants import LOG2E  # the kernels' lse is base 2: L₂ = L · log2(e)
from flashlab.launch.interpreter_notice import count_interpreted, interpreter_tiles
from flashlab.launch.layouts import output_like, unpack_qkv
from flashlab.launch.spec import AttentionSpec
from flashlab.reference.first_order import first_order_only
from flashlab.reference.naive import soft_cap, window_band


def draw_seed() -> Tensor:
    """The Philox seed of one dropout call, from torch's default generator (so
    ``torch.manual_seed`` makes dropout reproducible), as a CPU int64 scalar tensor: a
    compiled graph then draws it per call instead of baking in a constant."""
    return torch.randint(0, 2**31 - 1, (), dtype=torch.int64)


_HALF = (torch.float16, torch.bfloat16)


def _on_cpu_in_fp32(q: Tensor, *tensors):
    """Half-precision CPU tensors as fp32 (see the module docstring); others unchanged. q, k,
    v share one dtype and device (checked by `flashlab.attention`), so q's decide."""
    if q.dtype not in _HALF or not q.is_cpu:
        return tensors
    return tuple(t.float() if t is not None and t.dtype in _HALF else t for t in tensors)


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    return t if t.dtype == dtype else t.to(dtype)


def _in_layout_of(result: Tensor, want: Tensor) -> Tensor:
    """``result`` in the empty tensor ``want``'s layout, the one the op's fake says: a copy only
    where the kernels saw another tensor than the op's input (a CPU half-precision call computed
    in fp32, or an input whose rows were made contiguous)."""
    return result if result.stride() == want.stride() else want.copy_(result)


_dispatch = None


def _launcher():
    """flashlab.launch.dispatch, imported on first use (it imports Triton; this module must not)
    and then kept: an import statement per call costs microseconds on a launch-bound path."""
    global _dispatch
    if _dispatch is None:
        from flashlab.launch import dispatch
        _dispatch = dispatch
    return _dispatch


def forward_kernels(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float,
                    seed: Tensor | None, is_causal: bool, scale: float, input_precision: str,
                    window_left: int = -1, window_right: int = -1, softcap: float = 0.0) -> tuple[Tensor, Tensor]:
    """The forward op's implementation, also called directly where no graph is traced and no
    gradient is wanted (inference calls are launch-bound: the dispatcher costs microseconds)."""
    spec = AttentionSpec.from_op(dropout_p, is_causal, scale, input_precision, window_left, window_right, softcap)
    qc, kc, vc, mask = _on_cpu_in_fp32(q, q, k, v, attn_mask)
    out, lse = _launcher().forward(qc, kc, vc, mask, spec, int(seed) if seed is not None else 0)
    out = _as(out, q.dtype)
    if qc is not q or q.stride(-1) != 1:            # the kernels saw a copy of q: O as the fake says
        out = _in_layout_of(out, output_like(q, out.shape[-1]))
    return out, lse


def _count_traced_cpu_call(q: Tensor, k: Tensor, is_causal: bool, window: tuple[int, int]) -> None:
    """A CPU call that reached the kernels through an op (a compiled or exported graph's, run now),
    counted towards the interpreter's notice (`flashlab.launch.interpreter_notice`); `flashlab.attention`
    counts its eager calls itself, which never pass through here."""
    if q.is_cpu:
        count_interpreted(interpreter_tiles(q, k, window_band(window, is_causal, q.shape[-2], k.shape[-2])))


def _forward_op(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float,
                seed: Tensor | None, is_causal: bool, scale: float, input_precision: str,
                window_left: int = -1, window_right: int = -1, softcap: float = 0.0) -> tuple[Tensor, Tensor]:
    _count_traced_cpu_call(q, k, is_causal, (window_left, window_right))
    return forward_kernels(q, k, v, attn_mask, dropout_p, seed, is_causal, scale, input_precision, window_left,
                           window_right, softcap)


flash_attention_forward = torch.library.custom_op("flashlab::flash_attention_forward", mutates_args=())(_forward_op)


@flash_attention_forward.register_fake
def _(q, k, v, attn_mask, dropout_p, seed, is_causal, scale, input_precision, window_left=-1, window_right=-1,
      softcap=0.0):
    B, H, n_q, _ = q.shape
    float_mask = attn_mask is not None and attn_mask.dtype != torch.bool     # L and each row's fix: new_lse
    return output_like(q, v.shape[-1]), q.new_empty((2, B, H, n_q) if float_mask else (B, H, n_q),
                                                    dtype=torch.float32)


def backward_kernels(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                     attn_mask: Tensor | None, dropout_p: float, seed: Tensor | None, is_causal: bool,
                     scale: float, input_precision: str, mask_grad: bool, window_left: int = -1,
                     window_right: int = -1, softcap: float = 0.0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward op's implementation, also called directly by `EagerFlashAttention`."""
    seed_value = int(seed) if seed is not None else 0
    spec = AttentionSpec.from_op(dropout_p, is_causal, scale, input_precision, window_left, window_right, softcap)
    qc, kc, vc, oc, gc, mask = _on_cpu_in_fp32(q, q, k, v, out, grad_out, attn_mask)
    dq, dk, dv = _launcher().backward(qc, kc, vc, oc, lse, gc, mask, spec, seed_value)
    dmask = (_mask_gradient(qc, kc, vc, oc, lse, gc, mask, spec, seed_value).to(attn_mask.dtype)
             if mask_grad else q.new_empty(0))
    grads = [_as(dq, q.dtype), _as(dk, k.dtype), _as(dv, v.dtype)]
    for i, t in enumerate((q, k, v)):
        if t.stride(-1) != 1:            # the kernels saw a row-contiguous copy of t
            grads[i] = _in_layout_of(grads[i], torch.empty_like(t))
    return *grads, dmask


flash_attention_backward = torch.library.custom_op("flashlab::flash_attention_backward", mutates_args=())(
    backward_kernels)


@flash_attention_backward.register_fake
def _(grad_out, q, k, v, out, lse, attn_mask, dropout_p, seed, is_causal, scale, input_precision, mask_grad,
      window_left=-1, window_right=-1, softcap=0.0):
    dmask = attn_mask.new_empty(attn_mask.shape) if mask_grad else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dmask


def _mask_gradient(q, k, v, out, lse, grad_out, attn_mask, spec: AttentionSpec, seed):
    """d loss / d attn_mask = dS, summed over the mask's broadcast dimensions:
        P = 2^(S − L),  dP = dO Vᵀ (∘ Z/(1−p) with dropout),  D = rowsum(dO ∘ O),  dS = P ∘ (dP − D)
    with S = (cap(Q Kᵀ·scale) + mask)·log2(e) as the kernels form it (the mask saturated at
    ±2.35e38; −inf where causal, outside the window or out of range), L the saved lse, and P times
    each row's fix c where the forward stored one (`flashlab.launch.dense.new_lse`). The mask is
    added after the soft-cap, so its gradient needs no factor of the cap's."""
    from flashlab.reference.naive import window_keep_mask
    row_fix, lse = (lse[1], lse[0]) if lse.dim() == 4 else (None, lse)     # c under L (`dense.new_lse`)
    B, H, n_q, _ = q.shape
    n_k, group = k.shape[2], H // k.shape[1]
    k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    bias = attn_mask.float()
    bias = torch.where(bias == float("-inf"), bias, bias.clamp(-2.35e38, 2.35e38) * LOG2E)   # as tile.apply_mask
    logits = (q.float() @ k.transpose(-1, -2)) * spec.scale
    logits = soft_cap(logits, spec.softcap)
    scores = logits * LOG2E + bias
    keep = window_keep_mask(n_q, n_k, spec.is_causal, spec.window, q.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    p = torch.exp2(scores - lse[..., None])                          # rows with no key: L = +inf → P = 0
    if row_fix is not None:
        p = p * row_fix[..., None]
    dp = grad_out.float() @ v.transpose(-1, -2)
    if spec.dropout_p > 0:
        from flashlab.launch.dense import dropout_keep_mask
        dp = dp * dropout_keep_mask(seed, B, H, n_q, n_k, spec.dropout_p, device=q.device) / (1 - spec.dropout_p)
    delta = (grad_out.float() * out.float()).sum(-1, keepdim=True)
    return (p * (dp - delta)).sum_to_size(attn_mask.shape)


class FlashAttentionFunction:
    """The forward op's autograd formula, registered with ``register_autograd``: the forward
    saves q, k, v, O and the log-sum-exp (and, with dropout, the seed: the mask is
    regenerated, never stored); the backward runs the backward op."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, attn_mask, dropout_p, seed, is_causal, scale, input_precision, *window_and_cap = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse, attn_mask, seed)
        ctx.options = (dropout_p, is_causal, scale, input_precision)
        ctx.window_and_cap = (*window_and_cap, *(-1, -1, 0.0)[len(window_and_cap):])   # defaults not passed

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, out, lse, attn_mask, seed = ctx.saved_tensors
        dropout_p, is_causal, scale, input_precision = ctx.options
        mask_grad = bool(attn_mask is not None and attn_mask.dtype != torch.bool and ctx.needs_input_grad[3])
        args = (grad_out, q, k, v, out, lse, attn_mask, dropout_p, seed, is_causal, scale, input_precision, mask_grad,
                *ctx.window_and_cap)
        # traced (compile's backward graph: fake or functional tensors): the op; eager: its body
        backward = backward_kernels if type(grad_out) is torch.Tensor and type(q) is torch.Tensor \
            else torch.ops.flashlab.flash_attention_backward
        dq, dk, dv, dmask = backward(*args)
        if backward is backward_kernels:      # eager: a second derivative raises (`first_order_only`)
            dq, dk, dv, dmask = first_order_only((dq, dk, dv, dmask), (q, k, v, attn_mask))
        # one gradient per input: q, k, v, the mask, then None for each option
        return dq, dk, dv, (dmask if mask_grad else None), *(None,) * (len(ctx.needs_input_grad) - 4)


class EagerFlashAttention(torch.autograd.Function):
    """The same forward and backward as the custom op, for eager calls on real tensors: a plain
    autograd.Function skips the dispatcher and the custom op's autograd wrapper, a few hundred
    µs of Python per forward+backward, which is as long as the kernels at routing-sized N.
    `flashlab.attention` takes it unless the call is traced (compile, export)."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, dropout_p, seed, is_causal, scale, input_precision, window_left=-1,
                window_right=-1, softcap=0.0):
        inputs = (q, k, v, attn_mask, dropout_p, seed, is_causal, scale, input_precision, window_left, window_right,
                  softcap)
        out, lse = forward_kernels(*inputs)
        ctx.set_materialize_grads(False)      # lse gets no gradient: no zeros tensor made for it
        FlashAttentionFunction.setup_context(ctx, inputs, (out, lse))
        return out, lse

    backward = staticmethod(FlashAttentionFunction.backward)


flash_attention_forward.register_autograd(FlashAttentionFunction.backward,
                                          setup_context=FlashAttentionFunction.setup_context)


# -- q, k and v packed in one tensor -----------------------------------------------------------
# An attention layer makes q, k and v with one projection, (B, N, 3·H·D) viewed as (B, N, 3, H, D).
# Given as three views, autograd gathers their gradients back into that layout with copies: in
# the backward, the three gradients are stacked (one copy) and the stack is reshaped to the
# projection's (B, N, 3·H·D) (a second copy, unless q, k, v were split along that dimension).
# Taking the packed tensor as the op's one input, the backward kernels write dQ, dK and dV
# straight into views of one (B, N, 3, H, D) buffer: no copy (FlashAttention-2's qkvpacked form).
#
#     flashlab::flash_attention_qkvpacked_forward(qkv, dropout_p, seed?, is_causal, scale,
#                                                 input_precision) -> (out, lse)
#     flashlab::flash_attention_qkvpacked_backward(grad_out, qkv, out, lse, dropout_p, seed?,
#                                                  is_causal, scale, input_precision) -> dqkv


def qkvpacked_forward_kernels(qkv: Tensor, dropout_p: float, seed: Tensor | None, is_causal: bool, scale: float,
                              input_precision: str) -> tuple[Tensor, Tensor]:
    """The packed forward op's implementation: the forward kernels on q, k, v, views of ``qkv``."""
    return forward_kernels(*unpack_qkv(qkv), None, dropout_p, seed, is_causal, scale, input_precision)


def _qkvpacked_forward_op(qkv: Tensor, dropout_p: float, seed: Tensor | None, is_causal: bool, scale: float,
                          input_precision: str) -> tuple[Tensor, Tensor]:
    q, k, _ = unpack_qkv(qkv)
    _count_traced_cpu_call(q, k, is_causal, (-1, -1))
    return qkvpacked_forward_kernels(qkv, dropout_p, seed, is_causal, scale, input_precision)


flash_attention_qkvpacked_forward = torch.library.custom_op("flashlab::flash_attention_qkvpacked_forward",
                                                            mutates_args=())(_qkvpacked_forward_op)


@flash_attention_qkvpacked_forward.register_fake
def _(qkv, dropout_p, seed, is_causal, scale, input_precision):
    q = unpack_qkv(qkv)[0]
    B, H, n_q, _ = q.shape
    return output_like(q), q.new_empty(B, H, n_q, dtype=torch.float32)


def qkvpacked_backward_kernels(grad_out: Tensor, qkv: Tensor, out: Tensor, lse: Tensor, dropout_p: float,
                               seed: Tensor | None, is_causal: bool, scale: float, input_precision: str) -> Tensor:
    """The packed backward op's implementation: dQ, dK, dV written into views of one buffer laid
    out as ``qkv`` (``empty_like``, as the fake says); copied in only where the kernels computed
    in other tensors (CPU half precision in fp32, a ``qkv`` whose head dimension is strided)."""
    dqkv = torch.empty_like(qkv)
    q, k, v = unpack_qkv(qkv)
    seed_value = int(seed) if seed is not None else 0
    qc, kc, vc, oc, gc = _on_cpu_in_fp32(q, q, k, v, out, grad_out)
    spec = AttentionSpec(scale, is_causal, None, 0.0, dropout_p, input_precision)
    if qc is q and q.stride(-1) == 1 and dqkv.stride(-1) == 1:
        _launcher().backward(q, k, v, out, lse, grad_out, None, spec, seed_value, grads=unpack_qkv(dqkv))
    else:
        grads = _launcher().backward(qc, kc, vc, oc, lse, gc, None, spec, seed_value)
        for into, grad in zip(unpack_qkv(dqkv), grads):
            into.copy_(grad)
    return dqkv


flash_attention_qkvpacked_backward = torch.library.custom_op("flashlab::flash_attention_qkvpacked_backward",
                                                             mutates_args=())(qkvpacked_backward_kernels)


@flash_attention_qkvpacked_backward.register_fake
def _(grad_out, qkv, out, lse, dropout_p, seed, is_causal, scale, input_precision):
    return torch.empty_like(qkv)


class QKVPackedFunction:
    """The packed forward op's autograd formula (``register_autograd``), as `FlashAttentionFunction`'s:
    saves qkv, O, the log-sum-exp and the seed; the backward returns one gradient, dqkv."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        qkv, dropout_p, seed, is_causal, scale, input_precision = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(qkv, out, lse, seed)
        ctx.options = (dropout_p, is_causal, scale, input_precision)

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        qkv, out, lse, seed = ctx.saved_tensors
        dropout_p, is_causal, scale, input_precision = ctx.options
        traced = not (type(grad_out) is torch.Tensor and type(qkv) is torch.Tensor)
        if traced:
            dqkv = torch.ops.flashlab.flash_attention_qkvpacked_backward(grad_out, qkv, out, lse, dropout_p, seed,
                                                                         is_causal, scale, input_precision)
        else:
            dqkv = qkvpacked_backward_kernels(grad_out, qkv, out, lse, dropout_p, seed, is_causal, scale,
                                              input_precision)
            dqkv, = first_order_only((dqkv,), (qkv,))
        return dqkv, None, None, None, None, None


class EagerQKVPackedAttention(torch.autograd.Function):
    """The packed op's forward and backward for eager calls on real tensors (no dispatcher), as
    `EagerFlashAttention` is the unpacked op's."""

    @staticmethod
    def forward(ctx, qkv, dropout_p, seed, is_causal, scale, input_precision):
        inputs = (qkv, dropout_p, seed, is_causal, scale, input_precision)
        out, lse = qkvpacked_forward_kernels(*inputs)
        ctx.set_materialize_grads(False)
        QKVPackedFunction.setup_context(ctx, inputs, (out, lse))
        return out, lse

    backward = staticmethod(QKVPackedFunction.backward)


flash_attention_qkvpacked_forward.register_autograd(QKVPackedFunction.backward,
                                                    setup_context=QKVPackedFunction.setup_context)
