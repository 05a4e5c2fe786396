"""Attention for short sequences: every key of a head fits in one tile.

Routing models (a TSP encoder over 20-100 cities) call attention with a huge batch and tiny
N: B = 512 instances × 8 heads, N = 20-100, D = 16. There the general kernels of
`flashlab.kernels.dense` spend more time being launched than computing: the backward is three
launches (D = rowsum(dO ∘ O), the dK/dV pass, the dQ pass), each over tiles mostly empty.
When all Nk keys fit in one BLOCK_N tile, a program that holds them sees every (query, key)
pair of its head, and the backward needs no second pass:

Forward, one program per (block of BLOCK_M queries, HEADS heads): for each head
    S = Q Kᵀ · scale·log2(e)          (one tile: every key at once, no online rescaling)
    m = rowmax S;  P̃ = 2^(S − m);  l = rowsum P̃;  O = P̃ V / l;  L = m + log2 l

Backward, one program per (HEADS k/v heads; with GQA each brings its GROUP q heads): K, V,
dK, dV stay on chip while the program's query blocks stream past:
    D_i = rowsum(dO_i ∘ O_i)                       (in the kernel: no preprocess launch)
    P = 2^(S − L),  dV += Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − D)
    dK += dSᵀ Q,  dQ_i = dS K · scale              (complete: this program saw every key)
One launch, every output tile written by exactly one program: no atomics, deterministic.

O and L are the general forward's (same layout, L in base 2), so either backward can follow
either forward. Masks and dropout use the general kernels' helpers (`_tile_scores`,
`dropout_keep`): the same masking and the same Philox mask for the same seed.

The path is taken when Nq and Nk are both ≤ `max_keys(D, dtype)` (`applies`): the program
keeps K, V (input dtype) and the fp32 dK, dV accumulators, Nk × D each, on chip for the
whole backward, so the limit is a budget of Nk × padded D: 8192 elements for 2-byte inputs
(Nk ≤ 128 at D ≤ 64, 64 at D = 128), half that for fp32 (128 at D ≤ 32, 64 at D = 64,
32 at D = 128); D > 128 never. At the budget's edge, dK + dV take 2·8192 fp32 values = 64
registers a thread at 8 warps, beside the BLOCK_M × BLOCK_N score tiles. Nq is held to
the same limit: one program walks all of a head's queries, so a long Nq would leave the GPU
idle where the general path spreads query blocks over programs.
FLASHLAB_SMALL_PATH=0 turns the path off (the general kernels run every shape); `general_kernels()`
does so for a ``with`` block.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from flashlab.kernels.dense import LOG2E, mask_row_shared
from flashlab.kernels.small import small_backward_kernel, small_forward_kernel
from flashlab.reference.first_order import first_order_only

from . import direct as direct_launch
from . import switches
from .autotune import _gpu_name as autotune_gpu_name
from .autotune import overriding
from .autotune_cache import gpu_slug
from .layouts import output_layout, unpack_qkv
from .runtime import kernel_for

MAX_TILE_ELEMENTS = {2: 8192, 4: 4096}   # keys × padded D held on chip, by bytes per input element
MAX_KEYS = 128                           # the widest score tile (BLOCK_M × 128) per step


def new_lse(batch: int, heads: int, n_q: int, float_mask: bool, device) -> torch.Tensor:
    """The forward's L, for its kernel to fill: (B, H, Nq) float32; with a float mask (2, B, H, Nq),
    L, then each row's c = 2^(L − m)/l (`flash_triton._l_fix`), which the backward needs where such
    a mask put a row's max m beyond what L = m + log2 l can hold beside it (finfo(float32).min).
    The kernels, forward and backward, take it as `split_lse` gives it."""
    return torch.empty((2, batch, heads, n_q) if float_mask else (batch, heads, n_q), dtype=torch.float32,
                       device=device)


def split_lse(lse: torch.Tensor, float_mask: bool) -> tuple[torch.Tensor, int]:
    """(L, l_fix_offset) for the kernels from `new_lse`'s buffer: with a float mask, L and how many
    entries after it each row's fix c sits (the forward writes c there, the backward multiplies its
    recomputed P by it); without, L and 0 (never read nor written). A (B, H, Nq) L given to the
    backward beside a float mask (a caller's own) gets c = 1 beside it: what the kernels did before
    c, never L's entries read as c."""
    if lse.dim() == 3:
        if not float_mask:
            return lse, 0
        lse = torch.stack((lse, torch.ones_like(lse)))
    assert lse.is_contiguous(), "the forward's (2, B, H, Nq) L and c are one contiguous buffer"
    return lse[0], lse[0].numel()


def _pow2(n: int) -> int:
    """n rounded up to a power of two, at least 16 (tl.dot's smallest side)."""
    return max(16, 1 << (int(n) - 1).bit_length())


@functools.cache
def max_keys(head_dim: int, dtype: torch.dtype) -> int:
    """The longest sequence (Nq and Nk) the small path takes at this head dimension and dtype;
    0 where it never applies (D > 128). See the module docstring for the budget."""
    block_d = _pow2(head_dim)
    if block_d > 128:
        return 0
    return min(MAX_KEYS, MAX_TILE_ELEMENTS[dtype.itemsize] // block_d)


def enabled(device_type: str = "cpu") -> bool:
    """FLASHLAB_SMALL_PATH=0: every shape runs the general kernels (the "before" of the GPU
    measurements); unset or =1: the small path where it applies, on CPU and GPU alike.

    On a GPU it is on by default, an H200 having shown it correct against float64 and faster than
    the kernels it replaces (results/h200/small-table.json, tsp-step.json). `device_type` is unused;
    callers pass it in case a device needs its own default again."""
    return switches.small_path()


@contextlib.contextmanager
def general_kernels():
    """FLASHLAB_SMALL_PATH=0 inside the ``with`` block, restored after it: every shape runs the
    tiled kernels of `flashlab.kernels.dense`, none this path (flashlab reads the switch on every
    call, so the block takes effect at once). Notebooks 05 and 06 check the tiled kernels with it
    at sizes that would otherwise take this path; the GPU measurements time the "before" with it."""
    before = os.environ.get("FLASHLAB_SMALL_PATH")
    os.environ["FLASHLAB_SMALL_PATH"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["FLASHLAB_SMALL_PATH"]
        else:
            os.environ["FLASHLAB_SMALL_PATH"] = before


def fits(n_q: int, n_k: int, head_dim: int, dtype: torch.dtype) -> bool:
    """Both lengths within `max_keys`: the shape alone, whatever the switches say."""
    limit = max_keys(head_dim, dtype)
    return n_q <= limit and n_k <= limit


def applies(n_q: int, n_k: int, head_dim: int, dtype: torch.dtype, device_type: str = "cpu") -> bool:
    """Whether a call of this shape takes the small path (`enabled` and `fits`)."""
    return fits(n_q, n_k, head_dim, dtype) and enabled(device_type)


# -- configurations --------------------------------------------------------------------------

@dataclass(frozen=True)
class SmallConfig:
    """How a small-path kernel is launched: BLOCK_M queries per step, HEADS heads per program
    (k/v heads in the backward), num_warps, and num_stages: with 2 the compiler may load the
    backward's next query block while the current one computes (software pipelining of its
    loop over query blocks). BLOCK_N is always all keys (padded)."""
    block_m: int
    heads: int = 1
    num_warps: int = 4
    num_stages: int = 1

    def kwargs(self) -> dict:
        return {"BLOCK_M": self.block_m, "HEADS": self.heads, "num_warps": self.num_warps,
                "num_stages": self.num_stages}

    def __str__(self) -> str:
        stages = f" s{self.num_stages}" if self.num_stages != 1 else ""
        return f"{self.block_m}xall h{self.heads} w{self.num_warps}{stages}"

    @classmethod
    def parse(cls, text: str) -> SmallConfig:
        """The configuration `str` wrote ("64xall h1 w4", "32xall h1 w2 s2")."""
        try:
            block, *fields = text.split()
            values = {f[0]: int(f[1:]) for f in fields}
            numbers = [int(block[:-4]), *values.values()]
            if not block.endswith("xall") or not set(values) <= {"h", "w", "s"} or len(values) != len(fields) \
                    or min(numbers) < 1:
                raise ValueError
            return cls(numbers[0], values.get("h", 1), values.get("w", 4), values.get("s", 1))
        except (ValueError, IndexError):
            raise ValueError(f"small-path configuration {text!r}: expected e.g. '64xall h1 w4' or "
                             f"'32xall h1 w2 s2'") from None


# The fastest launch of each kernel measured on a GPU model, by padded head dimension and keys:
# {"forward | 16 | 128": "64xall h1 w4", ...}, one file per model (named as the autotuner's
# shipped decisions are), written by `python -m flashlab.bench ship-launches` from the
# small-launches suite's records (test_flash_small checks that each is what its records give).
# Other GPUs take the rule in `default_config`.
MEASURED_DIR = Path(__file__).with_name("tuned") / "small_path"


def measured_path(gpu_name: str) -> Path:
    return MEASURED_DIR / f"{gpu_slug(gpu_name)}.json"


@functools.cache
def measured_decisions(gpu_name: str) -> dict[str, SmallConfig]:
    """The measured launches for this GPU model ({} for one never measured)."""
    path = measured_path(gpu_name) if gpu_name else None
    if path is None or not path.exists():
        return {}
    table = json.loads(path.read_text())
    if table.get("gpu") != gpu_name:
        return {}
    return {key: SmallConfig.parse(text) for key, text in table["decisions"].items()}


def decision_key(kernel: str, head_dim: int, n_k: int, element_size: int) -> str:
    """"kernel | padded D | padded keys | bytes per input element": the element size decides the
    tiles' registers and shared memory (bf16 and fp16 alike, fp32 double)."""
    return f"{kernel} | {_pow2(head_dim)} | {_pow2(n_k)} | {element_size}"


def _gpu_name(device: torch.device) -> str:
    """The autotuner's (cached) device name; "" where no GPU can be asked (CPU tests of the rule)."""
    return autotune_gpu_name(device) if torch.cuda.is_available() else ""


def default_config(kernel: str, n_q: int, n_k: int, device: torch.device, head_dim: int = 64,
                   element_size: int = 2) -> SmallConfig:
    """The launch of ``kernel`` ("forward" or "backward") for this shape.

    GPU: on a GPU model whose launches were measured (`MEASURED_DIR`: the H200, the H100), the fastest
    measured launch at this padded head dimension, key count and element size (``element_size``:
    bytes per input element). Elsewhere, and for shapes and dtypes not measured, this rule: a
    score tile BLOCK_M × BLOCK_N of at most 64 × 128 in the forward (one step covers N ≤ 64
    whole) and 32 × 128 in the backward, which keeps P, dP and dS (three fp32 tiles)
    beside dK and dV; 4 warps; one head per program: B·H = 4096 programs are 30 waves of an
    H200's 132 SMs already, so packing heads buys no occupancy. At D = 16 (the routing models')
    dK and dV are small enough for a 64 × 128 backward tile, and short sequences run best on
    16-row tiles with 2 warps: an H200's forward+backward replayed from a CUDA graph (B·H = 4096,
    bf16; an earlier small-launches record, in the git history of results/h200/)
    took 0.167 ms at N = 100 with 64 rows against 0.238 with 32, and 0.032 ms at N = 20 with 16
    rows and 2 warps against 0.037 with 32 and 4. Other head dimensions keep the 32-row tile
    (not measured against the alternatives). Interpreter: the whole sequence in one step (fewer,
    larger numpy operations)."""
    block_n = _pow2(n_k)
    if device.type != "cuda":
        return SmallConfig(block_m=_pow2(n_q))
    measured = measured_decisions(_gpu_name(device)).get(decision_key(kernel, head_dim, n_k,
                                                                                 element_size))
    if measured is not None:
        # measured with Nq = Nk; fewer queries than a measured tile's rows need no more rows than Nq
        return dataclasses.replace(measured, block_m=min(measured.block_m, _pow2(n_q)))
    if kernel == "backward" and _pow2(head_dim) == 16:
        if block_n <= 32:
            return SmallConfig(block_m=16, num_warps=2)
        return SmallConfig(block_m=min(_pow2(n_q), 8192 // block_n))
    budget = 8192 if kernel == "forward" else 4096
    return SmallConfig(block_m=min(_pow2(n_q), max(16, budget // block_n)))


_forced: dict[str, SmallConfig] = {}


def force(**configs: SmallConfig):
    """Launch the small kernels with these configurations, e.g.
    ``force(forward=SmallConfig(16, heads=2))`` (the GPU script's comparisons, tests)."""
    return overriding(_forced, ("forward", "backward"), configs)


# -- launches --------------------------------------------------------------------------------
# Everything a launch needs that depends only on the call's signature (shapes, strides,
# dtype, flags) is worked out once per signature and kept: at routing-model sizes a
# kernel runs for tens of µs, about what recomputing strides and grids in Python costs.
# On a GPU that plan is also what `direct_launch` keeps the compiled kernel under, so the
# second call of a signature skips Triton's own per-call Python as well.

_plans: dict = {}
_MAX_PLANS = 1024            # emptied when full


def _plan(key: tuple, build):
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        plan = _plans[key] = build()
    return plan


def small_forward(q, k, v, mask, mask_strides, has_mask, mask_is_bool, dropout_p, seed, is_causal, scale,
                  input_precision):
    """The small forward: O and the base-2 log-sum-exp L, as `flash_launch.flash_forward`
    returns them. q, k, v have contiguous rows (head dimension stride 1); the mask is
    `flash_launch._mask_args`'s."""
    dropout = dropout_p > 0
    row_shared = mask_row_shared(mask_strides, has_mask, True, _pow2(k.shape[2]))   # read per call: in the key
    key = ("forward", q.shape, q.stride(), k.shape, k.stride(), v.stride(), mask_strides, has_mask, mask_is_bool,
           row_shared, dropout, is_causal, input_precision, q.dtype, q.is_cuda, _forced.get("forward"))

    def build():
        B, H, n_q, head_dim = q.shape
        n_k, group = k.shape[2], H // k.shape[1]
        config = _config("forward", n_q, n_k, q.device, head_dim, q.element_size())
        out_shape, out_strides = output_layout(q)          # a function of q's strides, part of the key
        grid = (-(-n_q // config.block_m) * -(-B * H // config.heads),)
        ints = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *mask_strides, *out_strides[:3],
                H, B * H, n_q, n_k, head_dim, group)
        constants = dict(IS_CAUSAL=is_causal, HAS_MASK=has_mask, MASK_IS_BOOL=mask_is_bool,
                         MASK_ROW_SHARED=row_shared, DROPOUT=dropout, BLOCK_N=_pow2(n_k), BLOCK_D=_pow2(head_dim),
                         INPUT_PRECISION=input_precision, **config.kwargs())
        return grid, ints, constants, (B, H, n_q), out_shape, out_strides

    plan = _plan(key, build)
    grid, ints, constants, lse_shape, out_shape, out_strides = plan
    out = torch.empty_strided(out_shape, out_strides, dtype=q.dtype, device=q.device)
    float_mask = has_mask and not mask_is_bool
    lse = new_lse(*lse_shape, float_mask, q.device)
    l_rows, l_fix_offset = split_lse(lse, float_mask)                                 # c's place: _l_fix
    args = (q, k, v, mask, out, l_rows, *ints, scale * LOG2E, seed, dropout_p, l_fix_offset)
    if q.is_cuda:
        direct_launch.launch(small_forward_kernel, plan, grid, args, 6, constants)   # the six tensors first
    else:
        kernel_for(small_forward_kernel, q.device)[grid](*args, **constants)
    return out, lse


def small_backward(q, k, v, out, lse, grad_out, mask, mask_strides, has_mask, mask_is_bool, dropout_p, seed,
                   is_causal, scale, input_precision, grads=None):
    """The small backward, one launch: (dq, dk, dv). Inputs as `small_forward`'s, plus O, its
    L as the forward returned it (`new_lse`), and dO (contiguous rows). ``grads``: (dq, dk, dv) to write into
    (views of one packed buffer, `flashlab.attention_qkvpacked`) instead of new tensors."""
    dropout = dropout_p > 0
    lse, l_fix_offset = split_lse(lse, has_mask and not mask_is_bool)
    # dQ, dK, dV: the layouts the custom op promises (empty_like), so strides follow q's, k's, v's
    dq, dk, dv = grads or (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    row_shared = mask_row_shared(mask_strides, has_mask, True, _pow2(k.shape[2]))
    key = ("backward", q.shape, q.stride(), k.shape, k.stride(), v.stride(), out.stride(), grad_out.stride(),
           dq.stride(), dk.stride(), dv.stride(), mask_strides, has_mask, mask_is_bool, row_shared, dropout,
           is_causal, input_precision, q.dtype, q.is_cuda, _forced.get("backward"))

    def build():
        B, H, n_q, head_dim = q.shape
        H_kv, n_k = k.shape[1], k.shape[2]
        config = _config("backward", n_q, n_k, q.device, head_dim, q.element_size())
        grid = (-(-B * H_kv // config.heads),)
        ints = tuple(s for t in (q, k, v) for s in t.stride()[:3]) + tuple(mask_strides) + tuple(
            s for t in (out, grad_out, dq, dk, dv) for s in t.stride()[:3]) + (H, B * H_kv, n_q, n_k, head_dim,
                                                                                H // H_kv)
        constants = dict(IS_CAUSAL=is_causal, HAS_MASK=has_mask, MASK_IS_BOOL=mask_is_bool,
                         MASK_ROW_SHARED=row_shared, DROPOUT=dropout, BLOCK_N=_pow2(n_k), BLOCK_D=_pow2(head_dim),
                         INPUT_PRECISION=input_precision, **config.kwargs())
        return grid, ints, constants

    plan = _plan(key, build)
    grid, ints, constants = plan
    args = (q, k, v, mask, out, grad_out, lse, dq, dk, dv, *ints, scale * LOG2E, scale, seed, dropout_p, l_fix_offset)
    if q.is_cuda:
        direct_launch.launch(small_backward_kernel, plan, grid, args, 10, constants)  # the ten tensors first
    else:
        kernel_for(small_backward_kernel, q.device)[grid](*args, **constants)
    return dq, dk, dv


def _config(kernel: str, n_q: int, n_k: int, device: torch.device, head_dim: int,
            element_size: int) -> SmallConfig:
    return _forced.get(kernel) or default_config(kernel, n_q, n_k, device, head_dim, element_size)


# -- eager calls -----------------------------------------------------------------------------

def takes_eager_path(n_q: int, n_k: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether an eager call of this shape can use `SmallAttention` (decided once per signature
    by `flashlab.attention`; the switches are read per call, by `flash_launch._takes_small_path`):
    the shape `fits`, and the kernels read the inputs as they are (half-precision CPU inputs are
    computed in fp32 by `flashlab.api.ops`, which the general route does)."""
    return not (device.type == "cpu" and dtype in (torch.float16, torch.bfloat16)) and fits(n_q, n_k, head_dim,
                                                                                           dtype)


class SmallAttention(torch.autograd.Function):
    """The small path's forward and backward behind one plain autograd.Function, for eager calls.

    `flashlab.attention` takes it for eager calls where the small path applies, with no window
    and no mask that wants a gradient. It calls `small_forward` and `small_backward` directly:
    the general route (`ops.EagerFlashAttention` → `ops.forward_kernels` → `flash_launch`)
    re-decides at every call what is fixed per signature (which kernels, contiguity, the mask's
    layout), passes eleven inputs and returns the log-sum-exp as a second, non-differentiable
    output. At routing-model sizes that Python is longer than the kernels: on an H200 an eager
    forward+backward at N = 20 took 376 µs through the general route and 283 µs through the
    thinnest Function around the same two launches, for 37 µs of GPU work
    (an earlier host-time record, in the git history of results/h200/). The kernels, their arguments
    and so their results are the same either way (tests/kernels/test_flash_small.py checks them bit for bit).

    ``spec`` is ``(mask_strides, has_mask, mask_is_bool, dropout_p, seed, is_causal, scale,
    input_precision)`` as `small_forward` takes them; ``mask`` is `flash_launch._mask_args`'s."""

    @staticmethod
    def forward(ctx, q, k, v, mask, spec):
        mask_strides, has_mask, mask_is_bool, dropout_p, seed, is_causal, scale, precision = spec
        out, lse = small_forward(q, k, v, mask, mask_strides, has_mask, mask_is_bool, dropout_p, seed, is_causal,
                                 scale, precision)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.spec = spec
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, mask = ctx.saved_tensors
        if grad_out.stride(-1) != 1:            # the kernel reads dO rows as contiguous
            grad_out = grad_out.contiguous()
        dq, dk, dv = small_backward(q, k, v, out, lse, grad_out, mask, *ctx.spec)
        return *first_order_only((dq, dk, dv), (q, k, v)), None, None


class SmallPackedAttention(torch.autograd.Function):
    """`SmallAttention` for q, k, v packed in one (B, N, 3, H, D) tensor with contiguous rows, no
    mask (`flashlab.attention_qkvpacked`'s eager calls on the small path): the backward kernel
    writes dQ, dK, dV into views of one gradient laid out as ``qkv``. ``spec`` as
    `SmallAttention`'s, for no mask."""

    @staticmethod
    def forward(ctx, qkv, spec):
        q, k, v = unpack_qkv(qkv)
        out, lse = small_forward(q, k, v, q, *spec)          # q: any pointer for the absent mask
        ctx.save_for_backward(qkv, out, lse)
        ctx.spec = spec
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qkv, out, lse = ctx.saved_tensors
        if grad_out.stride(-1) != 1:            # the kernel reads dO rows as contiguous
            grad_out = grad_out.contiguous()
        dqkv = torch.empty_like(qkv)
        q, k, v = unpack_qkv(qkv)
        small_backward(q, k, v, out, lse, grad_out, q, *ctx.spec, grads=unpack_qkv(dqkv))
        return *first_order_only((dqkv,), (qkv,)), None
