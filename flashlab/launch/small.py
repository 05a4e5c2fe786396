"""Launching the small path: attention for short sequences, every key of a head in one tile.

Routing models (a TSP encoder over 20-100 cities) call attention with a huge batch and tiny
N: B = 512 instances × 8 heads, N = 20-100, D = 16. There the dense kernels spend more time
being launched than computing: the backward is three launches (D = rowsum(dO ∘ O), the dK/dV
pass, the dQ pass), each over tiles mostly empty. When all Nk keys fit in one tile, one forward
launch and one backward launch do the whole call (`flashlab.kernels.small` derives them).

The path is taken when Nq and Nk are both ≤ `max_keys(D, dtype)` (`applies`): the backward
program keeps K, V (input dtype) and the fp32 dK, dV accumulators, Nk × D each, on chip, so the
limit is a budget of Nk × padded D: 8192 elements for 2-byte inputs (Nk ≤ 128 at D ≤ 64, 64 at
D = 128), half that for fp32 (128 at D ≤ 32, 64 at D = 64, 32 at D = 128); D > 128 never. At the
budget's edge, dK + dV take 2·8192 fp32 values = 64 registers a thread at 8 warps, beside the
BLOCK_M × BLOCK_N score tiles. Nq is held to the same limit: one program walks all of a head's
queries, so a long Nq would leave the GPU idle where the dense kernels spread query blocks over
programs. ``FLASHLAB_SMALL_PATH=0`` turns the path off.

At these sizes a kernel runs for tens of µs, about what Python spends deciding a launch, so
everything that depends only on the call's signature is worked out once and kept (`_plan`); on
a GPU the compiled kernel is then launched directly (`flashlab.launch.direct`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from flashlab.kernels.small import small_backward_kernel, small_forward_kernel
from flashlab.reference.first_order import first_order_only

from . import direct as direct_launch
from . import switches
from .autotune import _gpu_name as autotune_gpu_name
from .autotune import overriding
from .autotune_cache import gpu_slug
from .dense import new_lse, split_lse
from .layouts import output_layout, unpack_qkv
from .masks import MaskArgs, row_shared
from .runtime import kernel_for
from .spec import AttentionSpec

MAX_TILE_ELEMENTS = {2: 8192, 4: 4096}   # keys × padded D held on chip, by bytes per input element
MAX_KEYS = 128                           # the widest score tile (BLOCK_M × 128) per step


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


def enabled() -> bool:
    """Unset or ``FLASHLAB_SMALL_PATH=1``: the small path where it applies, on CPU and GPU alike;
    ``=0``: every shape runs the dense kernels."""
    return switches.small_path()


def fits(n_q: int, n_k: int, head_dim: int, dtype: torch.dtype) -> bool:
    """Both lengths within `max_keys`: the shape alone, whatever the switches say."""
    limit = max_keys(head_dim, dtype)
    return n_q <= limit and n_k <= limit


def applies(n_q: int, n_k: int, head_dim: int, dtype: torch.dtype) -> bool:
    """Whether a call of this shape takes the small path (`enabled` and `fits`)."""
    return fits(n_q, n_k, head_dim, dtype) and enabled()


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
# small-launches suite's record (test_flash_small checks that each is what its record gives).
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

    GPU: on a GPU model whose launches were measured (`MEASURED_DIR`), the fastest measured launch
    at this padded head dimension, key count and element size (``element_size``: bytes per input
    element). Elsewhere, and for shapes and dtypes not measured, this rule: a score tile
    BLOCK_M × BLOCK_N of at most 64 × 128 in the forward (one step covers N ≤ 64 whole) and
    32 × 128 in the backward, which keeps P, dP and dS (three fp32 tiles) beside dK and dV;
    4 warps; one head per program (B·H = 4096 programs already fill many waves of a GPU's SMs,
    so packing heads buys no occupancy). At D = 16 (the routing models') dK and dV are small
    enough for a 64 × 128 backward tile, and short sequences run best on 16-row tiles with
    2 warps (the small-path suite's launch choices measure these). Interpreter: the whole
    sequence in one step (fewer, larger numpy operations)."""
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
# On a GPU that plan is also what `flashlab.launch.direct` keeps the compiled kernel under, so the
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


def forward(q, k, v, mask: MaskArgs, spec: AttentionSpec, seed: int = 0):
    """The small forward: O and the base-2 log-sum-exp L, as `flashlab.launch.dense.forward`
    returns them, for (B, H, N, D) q, k, v with contiguous rows."""
    shared = row_shared(mask, True, _pow2(k.shape[2]))   # read per call: in the key
    key = ("forward", q.shape, q.stride(), k.shape, k.stride(), v.stride(), mask.strides, mask.present, mask.is_bool,
           shared, spec, q.dtype, q.is_cuda, _forced.get("forward"))

    def build():
        B, H, n_q, head_dim = q.shape
        n_k, group = k.shape[2], H // k.shape[1]
        config = _config("forward", n_q, n_k, q.device, head_dim, q.element_size())
        out_shape, out_strides = output_layout(q)          # a function of q's strides, part of the key
        grid = (-(-n_q // config.block_m) * -(-B * H // config.heads),)
        (qk_scale, softcap, _, _), flags = spec.kernel_args(n_q, n_k)
        ints = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *mask.strides, *out_strides[:3],
                H, B * H, n_q, n_k, head_dim, group, qk_scale, softcap)
        del flags["HAS_WINDOW"]                            # (never a window: `dispatch` keeps them off this path)
        constants = dict(HAS_MASK=mask.present, MASK_IS_BOOL=mask.is_bool, MASK_ROW_SHARED=shared, **flags,
                         BLOCK_N=_pow2(n_k), BLOCK_D=_pow2(head_dim), **config.kwargs())
        return grid, ints, constants, (B, H, n_q), out_shape, out_strides

    plan = _plan(key, build)
    grid, ints, constants, lse_shape, out_shape, out_strides = plan
    out = torch.empty_strided(out_shape, out_strides, dtype=q.dtype, device=q.device)
    lse = new_lse(*lse_shape, mask.additive, q.device)
    l_rows, l_fix_offset = split_lse(lse, mask.additive)                            # c's place: tile.l_fix
    args = (q, k, v, mask.tensor, out, l_rows, *ints, seed, spec.dropout_p, l_fix_offset)
    if q.is_cuda:
        direct_launch.launch(small_forward_kernel, plan, grid, args, 6, constants)   # the six tensors first
    else:
        kernel_for(small_forward_kernel, q.device)[grid](*args, **constants)
    return out, lse


def backward(q, k, v, out, lse, grad_out, mask: MaskArgs, spec: AttentionSpec, seed: int = 0, grads=None):
    """The small backward, one launch: (dq, dk, dv). Inputs as `forward`'s, plus O, its L as the
    forward returned it (`flashlab.launch.dense.new_lse`), and dO (contiguous rows). ``grads``:
    (dq, dk, dv) to write into (views of one packed buffer, `flashlab.attention_qkvpacked`)."""
    lse, l_fix_offset = split_lse(lse, mask.additive)
    # dQ, dK, dV: the layouts the custom op promises (empty_like), so strides follow q's, k's, v's
    dq, dk, dv = grads or (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    shared = row_shared(mask, True, _pow2(k.shape[2]))
    key = ("backward", q.shape, q.stride(), k.shape, k.stride(), v.stride(), out.stride(), grad_out.stride(),
           dq.stride(), dk.stride(), dv.stride(), mask.strides, mask.present, mask.is_bool, shared, spec, q.dtype,
           q.is_cuda, _forced.get("backward"))

    def build():
        B, H, n_q, head_dim = q.shape
        H_kv, n_k = k.shape[1], k.shape[2]
        config = _config("backward", n_q, n_k, q.device, head_dim, q.element_size())
        grid = (-(-B * H_kv // config.heads),)
        (qk_scale, softcap, _, _), flags = spec.kernel_args(n_q, n_k)
        del flags["HAS_WINDOW"]
        ints = tuple(s for t in (q, k, v) for s in t.stride()[:3]) + tuple(mask.strides) + tuple(
            s for t in (out, grad_out, dq, dk, dv) for s in t.stride()[:3]) + (
            H, B * H_kv, n_q, n_k, head_dim, H // H_kv, qk_scale, spec.scale, softcap)
        constants = dict(HAS_MASK=mask.present, MASK_IS_BOOL=mask.is_bool, MASK_ROW_SHARED=shared, **flags,
                         BLOCK_N=_pow2(n_k), BLOCK_D=_pow2(head_dim), **config.kwargs())
        return grid, ints, constants

    plan = _plan(key, build)
    grid, ints, constants = plan
    args = (q, k, v, mask.tensor, out, grad_out, lse, dq, dk, dv, *ints, seed, spec.dropout_p, l_fix_offset)
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
    by `flashlab.attention`; the switches are read per call, by `dispatch.takes_small_path`):
    the shape `fits`, and the kernels read the inputs as they are (half-precision CPU inputs are
    computed in fp32 by `flashlab.api.ops`, which the general route does)."""
    return not (device.type == "cpu" and dtype in (torch.float16, torch.bfloat16)) and fits(n_q, n_k, head_dim,
                                                                                           dtype)


class SmallAttention(torch.autograd.Function):
    """The small path's forward and backward behind one plain autograd.Function, for eager calls.

    `flashlab.attention` takes it for eager calls where the small path applies, with no window
    and no mask that wants a gradient. It calls `forward` and `backward` directly: the general
    route (`ops.EagerFlashAttention` → `ops.forward_kernels` → `dispatch`) re-decides at every
    call what is fixed per signature (which kernels, contiguity, the mask's layout), passes
    eleven inputs and returns the log-sum-exp as a second, non-differentiable output, and at
    routing-model sizes that Python is longer than the kernels. The kernels, their arguments and
    so their results are the same either way (tests/kernels/test_flash_small.py checks them bit
    for bit). ``mask`` is `flashlab.launch.masks.mask_args`'s; ``seed`` dropout's."""

    @staticmethod
    def forward(ctx, q, k, v, mask: MaskArgs, spec: AttentionSpec, seed: int):
        out, lse = forward(q, k, v, mask, spec, seed)
        ctx.save_for_backward(q, k, v, out, lse, mask.tensor)
        ctx.mask, ctx.spec, ctx.seed = mask, spec, seed
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, mask_tensor = ctx.saved_tensors
        if grad_out.stride(-1) != 1:            # the kernel reads dO rows as contiguous
            grad_out = grad_out.contiguous()
        mask = ctx.mask._replace(tensor=mask_tensor)
        dq, dk, dv = backward(q, k, v, out, lse, grad_out, mask, ctx.spec, ctx.seed)
        return *first_order_only((dq, dk, dv), (q, k, v)), None, None, None


class SmallPackedAttention(torch.autograd.Function):
    """`SmallAttention` for q, k, v packed in one (B, N, 3, H, D) tensor with contiguous rows, no
    mask (`flashlab.attention_qkvpacked`'s eager calls on the small path): the backward kernel
    writes dQ, dK, dV into views of one gradient laid out as ``qkv``."""

    @staticmethod
    def forward(ctx, qkv, spec: AttentionSpec, seed: int):
        q, k, v = unpack_qkv(qkv)
        out, lse = forward(q, k, v, MaskArgs(q, (0, 0, 0, 0), False, False), spec, seed)
        ctx.save_for_backward(qkv, out, lse)
        ctx.spec, ctx.seed = spec, seed
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qkv, out, lse = ctx.saved_tensors
        if grad_out.stride(-1) != 1:            # the kernel reads dO rows as contiguous
            grad_out = grad_out.contiguous()
        dqkv = torch.empty_like(qkv)
        q, k, v = unpack_qkv(qkv)
        backward(q, k, v, out, lse, grad_out, MaskArgs(q, (0, 0, 0, 0), False, False), ctx.spec, ctx.seed,
                 grads=unpack_qkv(dqkv))
        return *first_order_only((dqkv,), (qkv,)), None, None
