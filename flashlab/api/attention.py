"""The public attention API: a drop-in for ``torch.nn.functional.scaled_dot_product_attention``
backed by flashlab's Triton kernels, and an attention ``nn.Module`` built on it. Inputs are
validated here, once; the kernels (`flashlab.api.ops`) and the PyTorch paths below do not check
again."""

from __future__ import annotations

import math
import numbers
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from flashlab.launch import runtime
from flashlab.launch.interpreter_notice import (  # noqa: F401
    InterpreterWarning,
    count_interpreted,
    interpreter_tiles,
    note_pytorch_path,
)
from flashlab.launch.layouts import unpack_qkv
from flashlab.launch.runtime import input_precision
from flashlab.launch.spec import AttentionSpec
from flashlab.reference.checks import (
    check_attention_inputs,
    check_softcap,
    check_window,
    default_scale,
    without_neg_views,
)
from flashlab.reference.naive import causal_keep_mask, naive_attention_unchecked, window_band
from flashlab.reference.tiled import tiled_attention_unchecked

from . import ops
from .ops import FlashAttentionFunction  # noqa: F401  (notebook 06 shows its source)

# Above this many (query block × key block) tiles a CPU call takes the PyTorch path instead of
# the interpreted kernels: the interpreter runs each tile as NumPy calls in Python, tens of
# milliseconds a tile, so the limit keeps an interpreted call to seconds; N = 65,536 would be
# 4 M tiles, hours. The PyTorch path computes the same blocks with torch ops (512 × 512 tiles):
# a few times slower than SDPA, far faster than interpreting.
INTERPRETER_MAX_TILES = 1024
PYTORCH_BLOCK = 512             # the PyTorch path's tile: few Python iterations, O(N·512) memory


def interpreted_tiles_allowed(tiles: int) -> bool:
    """Whether a CPU call of this many 32 × 32 tiles runs the interpreted kernels (counted towards
    the once-a-process `InterpreterWarning`) rather than a PyTorch path: ``tiles`` within
    `_cpu_tile_limit`. `decode_attention` and `varlen_attention` ask it too."""
    limit = _cpu_tile_limit()
    if tiles > limit:
        if limit:                                   # the kernels are on, but this call is too large for them
            note_pytorch_path(tiles, limit, stacklevel=4)
        return False
    count_interpreted(tiles, stacklevel=4)
    return True


def _check(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, window, softcap):
    if not isinstance(is_causal, bool):                 # 'yes' or None would otherwise read as truthy or falsy
        raise TypeError(f"is_causal: {is_causal!r} is not a bool. Pass True (query i sees keys 0..i) or False.")
    if not isinstance(enable_gqa, bool):                # as SDPA's argument parser: 'yes' is no bool
        raise TypeError(f"enable_gqa: {enable_gqa!r} is not a bool. Pass True (k and v may have fewer heads than "
                        "q) or False.")
    check_attention_inputs(q, k, v, attn_mask, is_causal, scale, enable_gqa=enable_gqa, sdpa_semantics=True,
                           names=("query", "key", "value"))
    if not (isinstance(dropout_p, (int, float)) and 0.0 <= dropout_p <= 1.0):
        raise ValueError(f"dropout_p: {dropout_p!r} is not a probability in [0, 1]. "
                         "Pass the fraction of attention weights to drop, e.g. 0.1.")
    check_window(window)
    check_softcap(softcap)


_PLAIN_SCALARS = (float, int, type(None))


def _scalar_argument(value):
    """A 0-d tensor or a NumPy scalar given for ``scale`` or ``dropout_p`` as its Python number, as
    SDPA's argument parser reads them (a tensor on a GPU waits for the value, as SDPA's does);
    anything else as given, for the checks to judge."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype != torch.bool:
        return value.item()
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, int, float, torch.SymInt, torch.SymFloat)):
        return float(value)                       # np.float32(0.5), np.int64(1): not bool-like np.bool_
    return value


def _cpu_tile_limit() -> int:
    """The most 32 × 32 tiles a CPU call may give the interpreted kernels: INTERPRETER_MAX_TILES,
    or 0 (every CPU call on the PyTorch path) with FLASHLAB_CPU_KERNELS=0."""
    return INTERPRETER_MAX_TILES if runtime.cpu_kernels_enabled() else 0


def _heads(t: torch.Tensor) -> int:
    return t.shape[-3] if t.dim() >= 3 else 1


def _as_4d(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(…, H, N, D) → (B, H, N, D), B the product of the leading dimensions (a view when it can)."""
    return t if t.dim() == 4 else t.reshape(-1, heads, t.shape[-2], t.shape[-1])


def _uses_kernels(q, k, v, attn_mask, dropout_p, band=None) -> bool:
    """Kernels (compiled on CUDA, interpreted on CPU) or the PyTorch path, decided per call."""
    if q.numel() == 0 or k.shape[-2] == 0 or q.shape[-1] == 0 or v.shape[-1] == 0:
        return False                                  # empty: nothing for a kernel to do
    if q.device.type == "cuda":
        runtime.require_triton("flashlab.attention on a CUDA tensor")
    elif q.device.type != "cpu" or not runtime.triton_available():
        return False
    from flashlab.launch.dense import KERNEL_DTYPES, MAX_HEAD_DIM
    if q.dtype not in KERNEL_DTYPES or max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM:
        return False                                  # float64, or D > 256
    if dropout_p > 0 and q.shape[-2] * k.shape[-2] >= 2**31:
        return False                                  # the kernels' RNG counter is int32
    if dropout_p >= 1:
        return False                                  # all dropped (zeros, as SDPA): no 1/(1 − p) for the kernels
    if q.device.type == "cpu":
        if torch.compiler.is_exporting() and not all(type(n) is int for n in (*q.shape, *k.shape)):
            # torch.export with dynamic sizes: the tile limit would be a guard on them, which export turns
            # into an assertion that fails inside the program's own declared range; the PyTorch path
            # (plain operations) runs at every size
            return False
        tiles, limit = interpreter_tiles(q, k, band), _cpu_tile_limit()
        if tiles > limit and limit and not torch.compiler.is_compiling():
            note_pytorch_path(tiles, limit, stacklevel=6)     # the user's call: attention → plan → here
        return tiles <= limit
    return True


def _pytorch_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, window=None, plain=False, softcap=0.0):
    """The PyTorch path (any dtype, any size): tiled when no mask, dropout or window is involved
    (O(N) memory), else the einsum version (an Nq × Nk tensor per head); always the einsum
    version with ``plain`` (inside torch.func transforms and traces: its plain operations are
    what every transform understands). k and v already have q's heads. Dropout draws its mask
    with torch.nn.functional.dropout. Half-precision inputs are computed in float32 and the
    output rounded once, as the kernels (float32 accumulators) and SDPA's CPU backends do: in
    fp16, scores plus a mask of −65504 (``finfo(float16).min``) would round away the scores,
    and bf16 softmax sums lose about twice the accuracy."""
    if q.dtype in (torch.float16, torch.bfloat16):
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.float()
        with torch.autocast(q.device.type, enabled=False):          # autocast would round the matmuls again
            out = _pytorch_attention(q.float(), k.float(), v.float(), attn_mask, dropout_p, is_causal, scale, window,
                                     plain, softcap)
        return out.to(q.dtype)
    if (not plain and attn_mask is None and dropout_p == 0 and window is None and not softcap and q.numel()
            and k.shape[-2] and q.shape[-1] and v.shape[-1]):
        return tiled_attention_unchecked(q, k, v, is_causal, scale, PYTORCH_BLOCK, PYTORCH_BLOCK)
    return naive_attention_unchecked(q, k, v, attn_mask, is_causal, scale, dropout_p=dropout_p, window=window,
                                     softcap=softcap)


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
              exact_fp32=False, window=None, softcap=None):
    """FlashAttention with the arguments and semantics of
    ``torch.nn.functional.scaled_dot_product_attention`` (its argument names too).

    Args:
        query (q below): ``(…, H, Nq, D)``; key (k): ``(…, H_kv, Nk, D)``; value (v):
            ``(…, H_kv, Nk, Dv)``, any number of leading dimensions (also none: ``(N, D)``),
            broadcasting against each other as in SDPA, heads included (also from a lower
            rank: ``(H, N, D)`` beside ``(B, H, N, D)``; a key of one head serves every query
            head). ``H_kv = H`` (or 1), or dividing H with ``enable_gqa=True`` (k's and v's
            counts may then differ). Dv may differ from D. float16, bfloat16, float32 or float64;
            any strides; zero-size dimensions give empty (or, Nk = 0, zero) outputs and zero
            gradients, as in SDPA.
        attn_mask: broadcastable to ``(…, H, Nq, Nk)``; boolean (True = takes part) or float
            (added to the scores; it gets SDPA's gradient, dS summed over its broadcast
            dimensions). Read tile by tile through its strides, never expanded. For "never
            attend" use False or −inf (a row with no key left gives zeros). A row whose every key
            is masked with ``torch.finfo(float32).min`` (as transformers masks) gives what SDPA's
            math backend gives, the mean of V, and its gradients: the kernels saturate a bias
            before it could overflow their base-2 scores, and a float mask makes the forward keep
            each row's correction to the saved log-sum-exp, which at −3.4e38 cannot hold log(Nk).
            (SDPA's CUDA kernels give zeros for such a row; its fused CPU kernel gives Nk times
            these gradients.) A whole row shifted by a large finite amount (−1e9 on every key) is
            outside what fp32 keeps: output and gradients are those of SDPA's own fp32 math, as
            far from float64's. NaN and +inf in a float mask are not looked for (that would be a
            pass over the mask per call): the kernels take a NaN as a masked key and spread a row
            over its +inf keys equally, where SDPA, and flashlab's PyTorch path, give NaN.
        dropout_p: probability of dropping each attention weight (survivors are scaled by
            1/(1 − p)), as in SDPA: pass 0.0 in evaluation. 1.0 drops every weight (zeros, on
            the PyTorch path), as in SDPA. The kernels' mask comes from an
            in-kernel Philox RNG seeded from torch's default generator and is regenerated in the
            backward, never stored; `flashlab.launch.dense.dropout_keep_mask` reproduces it.
            The PyTorch path (below) drops with ``torch.nn.functional.dropout`` instead: one
            seed gives different masks on the two routes (each reproducible), so on a CPU the
            mask of a call can change with its batch size, which picks the route. Under
            ``torch.compile`` with Inductor the seed is drawn by Inductor's own random numbers,
            as every random op is there: reproducible, but not eager's mask for the same
            ``torch.manual_seed`` (``torch._inductor.config.fallback_random = True`` draws eager's).
        is_causal: query i sees keys 0..i (top-left aligned, like PyTorch). With ``attn_mask``
            too only on CPU tensors (both apply), where torch 2.13's SDPA also takes both.
        scale: default ``1/sqrt(D)`` (D of q and k); any finite number, as in SDPA.
        enable_gqa: grouped-query / multi-query attention.
        exact_fp32: force exact fp32 products even where torch allows TF32 (see below).
        window: ``(left, right)``, a sliding window (not in SDPA): query i sees keys
            i + Nk − Nq − left … i + Nk − Nq + right, −1 unbounded on that side, as in
            `flashlab.varlen_attention` (FlashAttention's alignment, to the end of the keys).
            ``window=(w, 0)`` with ``is_causal=True`` is a sliding window of the w keys before each
            query and itself. With ``is_causal`` (top-left) or ``attn_mask`` too, all apply; Nq = Nk
            makes the two alignments one. With Nq < Nk (a chunk of new queries after cached keys) the
            two differ and together may leave every row empty (zeros): there, pass ``window=(w, 0)``
            alone, which is already causal at the end of the keys. The kernels visit only the tiles the window touches
            (forward and backward), so the work grows with w, not with Nk.

    Returns:
        ``(…, H, Nq, Dv)``; rows with no key to attend to give zeros and zero gradients.

    Precision: float32 products are exact by default, as SDPA's; TF32 only on a GPU and only
    when torch allows it for float32 matmuls (``torch.backends.cuda.matmul.allow_tf32 = True``
    or ``torch.set_float32_matmul_precision("high")``), unless ``exact_fp32=True``. TF32
    operands are rounded to nearest, as PyTorch's TF32 matmuls round them (the tensor cores
    alone would truncate).

    Where it runs, decided per call (nothing is set at import):

    - CUDA tensors: the compiled Triton kernels (fp16, bf16, fp32, D and Dv ≤ 256).
    - CPU tensors: the same kernels in Triton's interpreter, fp16/bf16 computed in fp32 there
      (the interpreter's half-precision arithmetic is not the GPU's). A call of more than
      ``INTERPRETER_MAX_TILES`` 32 × 32 tiles (about 15 s of interpreter per forward) takes
      the PyTorch path instead, without a warning. ``FLASHLAB_CPU_KERNELS=0`` sends every CPU
      call there (read per call): a model's CPU tests then run at PyTorch's speed instead of
      the interpreter's, hundreds of times slower, without exercising the kernels.
    - float64, D > 256, empty inputs, no Triton installed, other devices: the PyTorch path
      (`tiled_attention`; `naive_attention` when a mask, dropout or a window is involved),
      fp16/bf16 computed in float32 there too, as the kernels accumulate.

    The kernels are the custom ops of `flashlab.api.ops`, so ``torch.compile(fullgraph=True)`` and
    ``torch.export`` capture a call as one node.

    As SDPA does: under ``torch.autocast`` the floating inputs (a float mask too; not float64)
    are cast to autocast's dtype. Inside a ``torch.func`` transform (``vmap``, ``grad``,
    ``jvp``…) and under ``torch.jit.trace`` the call runs the einsum version
    (`flashlab.naive_attention`), whose plain PyTorch operations every transform understands
    and a trace can record (from the traced sizes, so a traced graph serves other shapes). First
    derivatives only: differentiating the gradients again (``create_graph=True``, then a gradient penalty) raises
    (`flashlab/reference/first_order.py`), except inside ``torch.func`` transforms.
    """
    q, k, v = query, key, value
    if not (getattr(q, "ndim", None) == getattr(k, "ndim", None) == getattr(v, "ndim", None)):
        q, k, v = _same_rank(q, k, v)
    if type(scale) not in _PLAIN_SCALARS or type(dropout_p) not in _PLAIN_SCALARS:
        scale, dropout_p = _scalar_argument(scale), _scalar_argument(dropout_p)
    if isinstance(q, torch.Tensor) and _autocasting(q):
        q, k, v, attn_mask = _autocast_inputs(q, k, v, attn_mask)
    plan = _call_plan(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, exact_fp32, window, softcap)
    # under torch.jit.trace the default 1/sqrt(D) is left to the einsum version, which computes it from
    # the traced size: a float here would be a constant of the graph, wrong for another head dimension
    jit_tracing = plan.transformed and torch._C._is_tracing()
    scale = scale if jit_tracing and scale is None else plan.scale
    dropout_p, window = plan.dropout_p, plan.window
    if plan.cpu_tiles and plan.eager:       # a traced call is counted by the op it becomes, when it runs
        count_interpreted(plan.cpu_tiles)
    if plan.broadcast is not None or plan.kv_repeats is not None:      # as SDPA broadcasts or repeats them
        q, k, v = _as_sdpa_shapes(q, k, v, plan.broadcast, plan.kv_repeats)
    if not plan.kernels:
        if jit_tracing and q.dim() >= 3:   # the repeat recorded from the traced sizes (1: no repeat), not a constant
            group = q.size(-3) // k.size(-3)
            k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
        elif (group := _heads(q) // max(_heads(k), 1)) > 1:
            k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
        # traced (compile, export, torch.func): the einsum version, whose plain operations take symbolic
        # sizes (the tiled version's Python loop over tiles would fix the length into the graph)
        return _pytorch_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, window, plain=not plan.eager,
                                  softcap=plan.softcap)

    # the kernels read storage, so a view with the negative bit is resolved first (a traced call's op gets
    # its inputs through the dispatcher, which does that); inline, not a loop: this runs on every call
    if plan.eager and (q.is_neg() or k.is_neg() or v.is_neg() or (attn_mask is not None and attn_mask.is_neg())):
        q, k, v, attn_mask = without_neg_views(q, k, v, attn_mask)
    q4, k4, v4, mask4 = q, k, v, attn_mask
    if plan.reshape:
        H, n_q, n_k = _heads(q), q.shape[-2], k.shape[-2]
        q4, k4, v4 = _as_4d(q, H), _as_4d(k, _heads(k)), _as_4d(v, _heads(k))
        if attn_mask is not None:
            mask4 = attn_mask.expand(*q.shape[:-2], n_q, n_k).reshape(q4.shape[0], H, n_q, n_k)
    # value head dim ≠ query head dim: zero-pad the narrower side to the common width. Zero
    # columns of q and k add nothing to Q Kᵀ; zero columns of V give output columns we drop.
    if plan.pad_qk:
        q4, k4 = F.pad(q4, (0, plan.pad_qk)), F.pad(k4, (0, plan.pad_qk))
    if plan.pad_v:
        v4 = F.pad(v4, (0, plan.pad_v))
    seed = ops.draw_seed() if dropout_p > 0 else None
    precision = plan.precision or input_precision(q.dtype, q.device, exact_fp32)
    args = (q4, k4, v4, mask4, dropout_p, seed, is_causal, scale, precision, *(window or (-1, -1)), plan.softcap)
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or (
        attn_mask is not None and attn_mask.requires_grad))
    # Eager calls on real tensors skip the dispatcher (a few hundred µs of Python per forward+
    # backward, as long as the kernels at small N); anything traced (compile, export: fake or
    # functional tensors) goes through the custom op. Short sequences go straight to the small
    # path's own Function (`launch.small.SmallAttention`), unless a float mask wants its gradient.
    spec = AttentionSpec(scale, is_causal, None, plan.softcap, dropout_p, precision) if plan.small else None
    if plan.small and not (wants_grad and attn_mask is not None and attn_mask.requires_grad) and \
            _launchers().dispatch.takes_small_path(q4, k4, spec):   # the switches a plan cannot hold, per call
        out = _small_eager(q4, k4, v4, mask4, spec, seed, wants_grad)
    elif plan.eager:
        out = (ops.EagerFlashAttention.apply(*args) if wants_grad else ops.forward_kernels(*args))[0]
    else:
        out = ops.flash_attention_forward(*args)[0]
    if plan.pad_v:
        out = out[..., :v.shape[-1]]
    if plan.reshape:                       # a view only where needed: grad_fn stays the op's
        out = out.reshape(*q.shape[:-1], v.shape[-1])
    return out


def attention_qkvpacked(qkv, dropout_p=0.0, is_causal=False, scale=None, exact_fp32=False):
    """Self-attention on q, k and v packed in one tensor, as an attention layer's fused
    projection makes them (FlashAttention-2's ``flash_attn_qkvpacked_func``).

    Args:
        qkv: ``(B, N, 3, H, D)``: ``proj(x).view(B, N, 3, H, D)`` for a projection ``proj`` of
            width 3·H·D; ``qkv[:, :, 0]`` is q, ``[:, :, 1]`` k, ``[:, :, 2]`` v.
        dropout_p, is_causal, scale, exact_fp32: as `attention`'s (SDPA's names: FlashAttention's
            ``causal`` and ``softmax_scale`` are ``is_causal`` and ``scale`` here).

    Returns:
        ``(B, N, H, D)``, contiguous: ``out.reshape(B, N, H·D)`` is a view, ready for the output
        projection.

    The same kernels and the same numbers as ``attention(q, k, v)`` on the three views
    (`flashlab.launch.layouts.unpack_qkv`). What differs is the backward: dQ, dK and dV are written into one
    ``(B, N, 3, H, D)`` gradient laid out as ``qkv``, which is the projection's output gradient
    as it is. Given three views instead, autograd stacks their gradients (a copy) and, for views
    made by ``permute``, reshapes the stack into the projection's layout (a second copy): each
    reads and writes 3·B·N·H·D elements, in every layer. Where the kernels do not run (float64,
    inside ``torch.func`` or ``torch.jit.trace``, a CPU call too large for the interpreter) this
    is ``attention`` on the three views. Like `attention`, it is a custom op under ``torch.compile``/``torch.export``.
    `MultiHeadAttention` and `flashlab.train.tsp.EncoderLayer` call it when their ``attention_fn`` is
    `attention` itself: not for a wrapper (a rotary one, a logging one), which must see q, k, v."""
    if isinstance(qkv, torch.Tensor) and qkv.is_nested:
        raise ValueError("qkv: a nested tensor; the kernels take dense tensors. For sequences of different lengths "
                         "use flashlab.varlen_attention (packed rows with cu_seqlens), or pad them.")
    if not (isinstance(qkv, torch.Tensor) and qkv.dim() == 5 and qkv.shape[2] == 3):
        got = f"shape {tuple(qkv.shape)}" if isinstance(qkv, torch.Tensor) else type(qkv).__name__
        raise ValueError(f"qkv: expected a (B, N, 3, H, D) tensor, q, k and v stacked in dimension 2; got {got}. "
                         "Pass proj(x).view(B, N, 3, H, D), or call flashlab.attention(q, k, v) on separate tensors.")
    if not qkv.is_floating_point():
        raise ValueError(f"qkv: dtype {qkv.dtype} is not supported here. Use torch.float16, torch.bfloat16, "
                         "torch.float32 or torch.float64, e.g. qkv.to(torch.float32).")
    if type(scale) not in _PLAIN_SCALARS or type(dropout_p) not in _PLAIN_SCALARS:
        scale, dropout_p = _scalar_argument(scale), _scalar_argument(dropout_p)
    if _autocasting(qkv):
        qkv = _autocast_inputs(qkv, None, None, None)[0]
    if qkv.stride(-1) != 1:                   # the kernels read rows of D contiguous elements
        qkv = qkv.contiguous()
    q, k, v = unpack_qkv(qkv)
    plan = _call_plan(q, k, v, None, dropout_p, is_causal, scale, False, exact_fp32, None, None)
    if not plan.kernels:
        return attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                         exact_fp32=exact_fp32).transpose(1, 2).contiguous()     # the layout the kernels give
    if plan.cpu_tiles and plan.eager:       # a traced call is counted by the op it becomes, when it runs
        count_interpreted(plan.cpu_tiles)
    if plan.eager and qkv.is_neg():         # the kernels read storage: see checks.without_neg_views
        qkv = qkv.resolve_neg()
        q, k, v = unpack_qkv(qkv)
    seed = ops.draw_seed() if plan.dropout_p > 0 else None
    precision = plan.precision or input_precision(qkv.dtype, qkv.device, exact_fp32)
    wants_grad = torch.is_grad_enabled() and qkv.requires_grad
    args = (qkv, plan.dropout_p, seed, is_causal, plan.scale, precision)
    spec = AttentionSpec(plan.scale, is_causal, None, 0.0, plan.dropout_p, precision)
    if plan.small and _launchers().dispatch.takes_small_path(q, k, spec):   # eager, one key tile: its own Function
        seed_value = int(seed) if seed is not None else 0
        small = _launchers().small
        out = (small.SmallPackedAttention.apply(qkv, spec, seed_value) if wants_grad
               else small.forward(q, k, v, _launchers().mask_args(None, q, k), spec, seed_value)[0])
    elif not plan.eager:                      # traced (compile, export): the custom op
        out = ops.flash_attention_qkvpacked_forward(*args)[0]
    elif wants_grad:
        out = ops.EagerQKVPackedAttention.apply(*args)[0]
    else:
        out = ops.qkvpacked_forward_kernels(*args)[0]
    return out.transpose(1, 2)


class _Plan(NamedTuple):
    """What `attention` decides from a call's signature alone (shapes, dtypes, devices, the
    options), once per signature for eager calls: the checks passed, and these."""
    scale: float
    dropout_p: float
    kernels: bool            # the Triton kernels (else the PyTorch path)
    reshape: bool            # not (B, H, N, D): flattened to 4-D for the kernels and back
    pad_qk: int              # zero columns added to q and k (Dv > D)
    pad_v: int               # zero columns added to v (D > Dv)
    precision: str | None    # the kernels' products; None: decided per call (fp32 on a GPU follows torch's TF32 flag)
    eager: bool              # real tensors outside a trace: skip the dispatcher
    small: bool              # eager, and the small path's own Function can take it (`_small_eager`)
    transformed: bool        # inside a torch.func transform or a jit trace: the einsum version (never cached)
    window: tuple[int, int] | None   # (left, right) as ints; None for no window (or (−1, −1))
    softcap: float           # the logits' soft cap, 0.0 for none
    cpu_tiles: int           # the kernels on a CPU: tiles the interpreter runs per forward (else 0)
    broadcast: tuple | None = None     # (leading shape, dimensions it excludes) q, k, v broadcast to, else None
    kv_repeats: tuple | None = None    # enable_gqa with k and v of different head counts: each one's repeat, else None


_PLANS: dict = {}            # eager calls' signatures → their _Plan (an attention layer has one or two)
_MAX_PLANS = 4096            # emptied when full: shapes that change every call must not grow it forever


def _call_plan(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, exact_fp32, window, softcap) -> _Plan:
    """The `_Plan` of this call: looked up for eager calls whose signature was seen before
    (checks and decisions are functions of the signature), else checked and built. A training
    step calls each layer's attention with one signature, and at routing-model sizes the
    kernels take about as long as these checks on the CPU."""
    # torch.func's transforms (vmap, grad, jvp) wrap tensors that still look like torch.Tensor;
    # torch.jit.trace records operations, and a Triton launch is none it can record. (Not asked
    # while torch.compile traces: Dynamo cannot trace _is_tracing, and compiles the custom op.)
    compiling = torch.compiler.is_compiling()
    transformed = not compiling and (torch._C._are_functorch_transforms_active() or torch._C._is_tracing())
    eager = type(q) is torch.Tensor and not compiling and not transformed
    key = None
    if (eager and type(k) is torch.Tensor and type(v) is torch.Tensor and type(is_causal) is bool
            and (attn_mask is None or type(attn_mask) is torch.Tensor)
            and type(dropout_p) in (float, int) and (scale is None or type(scale) in (float, int))
            and (window is None or (type(window) is tuple and all(type(w) is int for w in window)))
            and (softcap is None or type(softcap) in (float, int))):
        try:                # (free in Python ≥ 3.11 unless raised)
            key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
                   None if attn_mask is None else (attn_mask.shape, attn_mask.dtype, attn_mask.device),
                   dropout_p, is_causal, scale, enable_gqa, exact_fp32, window, softcap,
                   q.is_cpu and _cpu_tile_limit())
        except RuntimeError:     # a nested tensor has no .shape: the checks below say so in one line
            key = None
        plan = _PLANS.get(key) if key is not None else None
        if plan is not None:
            return plan
    if transformed and torch._C._is_tracing():
        # torch.jit.trace hands the checks each size as a traced number, and every comparison warns that
        # the graph cannot record it (a TracerWarning each, about 20 a call). The checks validate this
        # call and build no operation; the einsum version records its sizes, the scale and GQA's repeat
        # from the traced shape, so the graph serves other lengths, head dimensions and batches. (SDPA's
        # broadcasting of the leading dimensions, when used, is recorded for the traced shapes.)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return _new_plan(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, exact_fp32, window, softcap,
                             compiling, transformed, eager, key)
    return _new_plan(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, exact_fp32, window, softcap,
                     compiling, transformed, eager, key)


def _new_plan(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, exact_fp32, window, softcap,
              compiling, transformed, eager, key) -> _Plan:
    """`_call_plan`'s work when the signature is new: the checks, then the decisions."""
    if any(isinstance(t, torch.Tensor) and (t.is_nested or t.layout != torch.strided) for t in (q, k, v)):
        _check(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, window, softcap)   # nested, sparse
    # the checks and decisions below see q, k, v as the call will use them (GQA's heads are not broadcast,
    # so the repeats can be read before the expansion)
    broadcast, kv_repeats = _leading_broadcast(q, k, v, enable_gqa), _gqa_kv_repeats(q, k, v, enable_gqa)
    q, k, v = _as_sdpa_shapes(q, k, v, broadcast, kv_repeats)
    _check(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, window, softcap)
    if not isinstance(exact_fp32, bool):               # 'yes' would otherwise read as True, and 0 or None as False
        raise TypeError(f"exact_fp32: {exact_fp32!r} is not a bool. Pass True (exact fp32 products even where torch "
                        "allows TF32) or False.")
    if window is not None:
        window = (int(window[0]), int(window[1]))
        if window == (-1, -1):                               # unbounded both ways: no window at all
            window = None
    band = None if window is None else window_band(window, is_causal, q.shape[-2], k.shape[-2])
    # the interpreter's tiles, for the CPU's limit: a window's exact count loops over query blocks, which
    # under torch.compile would fix the length into the graph (a recompile for every new length), so a
    # traced call counts every tile, an upper bound
    tile_band = None if compiling else band
    head_dim, value_dim = q.shape[-1], v.shape[-1]
    width = max(head_dim, value_dim)
    tf32_possible = q.dtype == torch.float32 and q.device.type == "cuda" and not exact_fp32
    kernels = not transformed and _uses_kernels(q, k, v, attn_mask, float(dropout_p), tile_band)
    small = eager and kernels and window is None and _launchers().small.takes_eager_path(
        q.shape[-2], k.shape[-2], width, q.dtype, q.device)
    plan = _Plan(scale=default_scale(head_dim, scale), dropout_p=float(dropout_p),
                 kernels=kernels,
                 reshape=q.dim() != 4, pad_qk=width - head_dim, pad_v=width - value_dim,
                 precision=None if tf32_possible else input_precision(q.dtype, q.device, exact_fp32), eager=eager,
                 small=small, transformed=transformed, window=window, softcap=check_softcap(softcap),
                 cpu_tiles=interpreter_tiles(q, k, tile_band) if kernels and q.device.type == "cpu" else 0,
                 broadcast=broadcast, kv_repeats=kv_repeats)
    if key is not None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _leading_broadcast(q, k, v, enable_gqa: bool):
    """(shape, excluded) when q, k and v broadcast, as SDPA broadcasts them, to one leading shape they do
    not all have yet, else None. The leading dimensions are all but the last ``excluded``: (N, D), and
    without GQA the heads too (a key or value of one head serves every query head, a query of one head
    meets every key head); with ``enable_gqa`` the heads follow GQA's rule instead (`check_attention_inputs`).
    None also when they do not broadcast, for the checks to name."""
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 3 for t in (q, k, v)):
        return None
    excluded = 3 if enable_gqa else 2
    shapes = (q.shape[:-excluded], k.shape[:-excluded], v.shape[:-excluded])
    if shapes[0] == shapes[1] == shapes[2]:
        return None
    try:
        return tuple(torch.broadcast_shapes(*shapes)), excluded
    except RuntimeError:
        return None


def _gqa_kv_repeats(q, k, v, enable_gqa: bool):
    """(k's repeat, v's repeat) when ``enable_gqa`` gives k and v different numbers of heads, each dividing
    q's, else None. SDPA repeats each to q's heads; repeating each to the least common multiple of the two
    (a divisor of q's) gives the same attention and keeps the rest grouped: q head i still reads key head
    i // (H / H_k) and value head i // (H / H_v)."""
    if not enable_gqa or not all(isinstance(t, torch.Tensor) and t.dim() >= 3 for t in (q, k, v)):
        return None
    heads, heads_k, heads_v = q.shape[-3], k.shape[-3], v.shape[-3]
    if heads_k == heads_v or not heads_k or not heads_v or heads % heads_k or heads % heads_v:
        return None
    common = math.lcm(heads_k, heads_v)
    return common // heads_k, common // heads_v


def _as_sdpa_shapes(q, k, v, broadcast, kv_repeats):
    """q, k, v expanded (views) to the leading shape of `_leading_broadcast`'s ``broadcast``, and k and v
    repeated by `_gqa_kv_repeats`'s ``kv_repeats`` (copies); either may be None."""
    if broadcast is not None:
        shape, excluded = broadcast
        q, k, v = (t if tuple(t.shape[:-excluded]) == shape else t.expand(*shape, *t.shape[-excluded:])
                   for t in (q, k, v))
    if kv_repeats is not None:
        k, v = k.repeat_interleave(kv_repeats[0], dim=-3), v.repeat_interleave(kv_repeats[1], dim=-3)
    return q, k, v


def _same_rank(q, k, v):
    """Inputs of different ranks, as SDPA broadcasts them: leading size-1 dimensions added
    (views), e.g. k, v ``(H, N, D)`` beside q ``(B, H, N, D)``. Anything not a tensor passes
    through for the checks to name."""
    tensors = (q, k, v)
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in tensors):
        return tensors                    # not tensors, or a 1-D one (no (N, D) to broadcast): for the checks to name
    rank = max(t.dim() for t in tensors)
    return tuple(t[(None,) * (rank - t.dim())] if t.dim() < rank else t for t in tensors)


_AUTOCAST_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)   # float64 is left alone, as autocast does


def _autocasting(q) -> bool:
    """Whether torch.autocast is on for q's device (CPU or CUDA: torch.is_autocast_enabled raises
    for others, "meta"). is_cuda/is_cpu, not q.device.type: this runs on every call."""
    return (q.is_cuda and torch.is_autocast_enabled("cuda")) or (q.is_cpu and torch.is_autocast_enabled("cpu"))


def _autocast_inputs(q, k, v, attn_mask):
    """q, k, v and a float mask in autocast's dtype for q's device, as autocast treats SDPA."""
    dtype = torch.get_autocast_dtype(q.device.type)
    cast = lambda t: t.to(dtype) if t is not None and t.dtype in _AUTOCAST_ELIGIBLE and t.dtype != dtype else t  # noqa: E731
    return cast(q), cast(k), cast(v), cast(attn_mask)


class _Launchers(NamedTuple):
    dispatch: object
    small: object
    dense: object
    mask_args: object


_launch_modules: _Launchers | None = None


def _launchers() -> _Launchers:
    """flashlab.launch's dispatch, small and dense modules and `mask_args`, imported on first use
    (they import Triton; this module must not) and then kept: an import statement per call costs
    microseconds on a launch-bound path."""
    global _launch_modules
    if _launch_modules is None:
        from flashlab.launch import dense, dispatch, small
        from flashlab.launch.masks import mask_args
        _launch_modules = _Launchers(dispatch, small, dense, mask_args)
    return _launch_modules


def _small_eager(q, k, v, attn_mask, spec: AttentionSpec, seed, wants_grad):
    """An eager call on the small path: (B, H, N, D) inputs, straight to `launch.small`'s kernels,
    with rows made contiguous and the mask laid out as `launch.dispatch` does for the general route."""
    launch = _launchers()
    q, k, v = (launch.dense.rows_contiguous(t) for t in (q, k, v))
    mask = launch.mask_args(attn_mask, q, k)
    seed = int(seed) if seed is not None else 0
    if wants_grad:
        return launch.small.SmallAttention.apply(q, k, v, mask, spec, seed)
    return launch.small.forward(q, k, v, mask, spec, seed)[0]


def _with_causal(attn_mask: torch.Tensor, n: int) -> torch.Tensor:
    """``attn_mask`` (bool: True takes part; float: added to the scores) with the causal mask folded
    in: query i sees keys 0..i and what ``attn_mask`` lets it see of them."""
    sees = causal_keep_mask(n, n, attn_mask.device)
    if attn_mask.dtype == torch.bool:
        return attn_mask & sees
    return torch.where(sees, attn_mask, float("-inf"))   # broadcasts a (B, 1, 1, N) padding mask to (B, 1, N, N)


class MultiHeadAttention(nn.Module):
    """Self-attention with a fused QKV projection, heads and an output projection, on
    `flashlab.attention`.

    Args:
        embed_dim: model width; ``num_heads`` must divide it.
        num_heads: attention heads.
        causal: apply a causal mask (for decoders); with an ``attn_mask`` too, both apply.
        bias: biases in the projections.
        dropout: attention-weight dropout probability, applied only in training mode.
    Input ``(B, N, embed_dim)`` → output ``(B, N, embed_dim)``. ``forward`` also takes an
    optional ``attn_mask`` broadcastable to ``(B, H, N, N)``.
    """

    def __init__(self, embed_dim: int, num_heads: int, causal: bool = False, bias: bool = True,
                 dropout: float = 0.0, attention_fn=attention):
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if not (isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{name}: expected a positive integer, got {value!r}.")
        if embed_dim % num_heads:
            raise ValueError(f"num_heads: {num_heads} does not divide embed_dim={embed_dim}. Pick a divisor of "
                             f"{embed_dim} (each head gets embed_dim / num_heads dimensions).")
        if not (isinstance(dropout, numbers.Real) and not isinstance(dropout, bool) and 0.0 <= dropout <= 1.0):
            raise ValueError(f"dropout: {dropout!r} is not a probability in [0, 1]. Pass the fraction of attention "
                             "weights to drop in training, e.g. 0.1 (0: none).")
        self.embed_dim = embed_dim
        self.num_heads, self.head_dim, self.causal = num_heads, embed_dim // num_heads, causal
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.out = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.attention_fn, self.dropout = attention_fn, dropout

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.embed_dim:
            tensor = isinstance(x, torch.Tensor)
            got = f"shape {tuple(x.shape)}" if tensor else type(x).__name__
            unbatched = tensor and x.dim() == 2 and x.shape[-1] == self.embed_dim
            fix = ("Add a batch dimension: x.unsqueeze(0)." if unbatched
                   else f"Give {self.embed_dim} features per token (the layer's embed_dim).")
            raise ValueError(f"x: expected (batch, N, embed_dim={self.embed_dim}), got {got}. {fix}")
        B, N, _ = x.shape
        dropout_p = self.dropout if self.training else 0.0
        qkv = self.qkv(x).view(B, N, 3, self.num_heads, self.head_dim)   # one matmul for q, k and v
        if self.attention_fn is attention and attn_mask is None:     # gradients land in qkv's layout: no copies
            return self.out(attention_qkvpacked(qkv, dropout_p=dropout_p, is_causal=self.causal).reshape(B, N, -1))
        # three (B, H, N, D) views, no copies; split along dimension 2, so that autograd's stack of
        # their gradients is already the projection's layout (one copy, not two)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        if self.causal and attn_mask is not None:
            attn_mask = _with_causal(attn_mask, N)    # SDPA (and so attention on a GPU) refuses both at once
        y = self.attention_fn(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                              is_causal=self.causal and attn_mask is None)
        return self.out(y.transpose(1, 2).reshape(B, N, -1))
