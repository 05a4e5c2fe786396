"""The kernels' loop bounds, read from the kernels' own helpers: `_key_range` (the key blocks a
query block visits, in the forward and the dQ pass) and `_query_range` (the query blocks the
dK/dV pass streams past a key block). A probe kernel calls each helper in every program and
stores what it returned, so `causal_tile_plan`, the Python picture notebook 05 draws, is
checked against the bounds the kernels really use; with sliding windows, the tiles visited
are exactly those the band touches (counted from the band's boolean mask)."""

# flashlab first: on a CPU-only machine it turns on Triton's interpreter, which must happen
# before triton.language's own jitted helpers (tl.cdiv) are defined.
import flashlab  # noqa: F401, I001
import pytest
import torch
import triton
import triton.language as tl

from flashlab.kernels.dense import FULL, MASKED, SKIPPED, _key_range, _query_range, causal_tile_plan
from flashlab.reference.naive import window_band, window_keep_mask
from flashlab.launch.runtime import kernel_for

SIZES = [(256, 256, 64, 32), (128, 512, 128, 64), (100, 70, 32, 32), (1, 1, 32, 32), (300, 200, 64, 64),
         (70, 100, 16, 32), (97, 97, 32, 16)]


@triton.jit
def _key_range_probe(OUT, n_q, n_k, band_lo, band_hi, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    lo, clean_lo, clean_hi, hi = _key_range(start_m, n_q, n_k, band_lo, band_hi, IS_CAUSAL, False, HAS_WINDOW,
                                            BLOCK_M, BLOCK_N)
    tl.store(OUT + 4 * start_m, lo)
    tl.store(OUT + 4 * start_m + 1, clean_lo)
    tl.store(OUT + 4 * start_m + 2, clean_hi)
    tl.store(OUT + 4 * start_m + 3, hi)


@triton.jit
def _query_range_probe(OUT, n_q, n_k, band_lo, band_hi, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                       FAST_PATH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    lo, clean_lo, clean_hi, hi = _query_range(start_n, n_q, n_k, band_lo, band_hi, IS_CAUSAL, False, HAS_WINDOW,
                                              FAST_PATH, BLOCK_M, BLOCK_N)
    tl.store(OUT + 4 * tl.program_id(0), lo)
    tl.store(OUT + 4 * tl.program_id(0) + 1, clean_lo)
    tl.store(OUT + 4 * tl.program_id(0) + 2, clean_hi)
    tl.store(OUT + 4 * tl.program_id(0) + 3, hi)


def kernel_key_ranges(n_q, n_k, block_m, block_n, is_causal=True, band=None):
    """(lo, clean_lo, clean_hi, hi) of every query block, as `_key_range` computes them inside a
    kernel (``band``: the window's (band_lo, band_hi), the launcher's causality folded in)."""
    out = torch.full((triton.cdiv(n_q, block_m), 4), -1, dtype=torch.int32)
    kernel_for(_key_range_probe, out.device)[(out.shape[0],)](
        out, n_q, n_k, *(band or (0, 0)), IS_CAUSAL=is_causal and band is None, HAS_WINDOW=band is not None,
        BLOCK_M=block_m, BLOCK_N=block_n)
    return out.tolist()


def kernel_query_ranges(n_q, n_k, block_m, block_n, is_causal=True, fast_path=True, band=None):
    """(lo, clean_lo, clean_hi, hi) of every key block, as `_query_range` computes them."""
    out = torch.full((triton.cdiv(n_k, block_n), 4), -1, dtype=torch.int32)
    kernel_for(_query_range_probe, out.device)[(out.shape[0],)](
        out, n_q, n_k, *(band or (0, 0)), IS_CAUSAL=is_causal and band is None, HAS_WINDOW=band is not None,
        FAST_PATH=fast_path, BLOCK_M=block_m, BLOCK_N=block_n)
    return out.tolist()


@pytest.mark.parametrize("n_q,n_k,block_m,block_n", SIZES)
def test_causal_tile_plan_is_the_kernels_own(n_q, n_k, block_m, block_n):
    """The forward runs key blocks [0, clean_hi) unchecked and [clean_hi, hi) checked: tile
    j is FULL, MASKED or SKIPPED exactly as `causal_tile_plan` says."""
    from_kernel = [[FULL if start_n < clean_hi else MASKED if start_n < hi else SKIPPED
                    for start_n in range(0, n_k, block_n)]
                   for lo, clean_lo, clean_hi, hi in kernel_key_ranges(n_q, n_k, block_m, block_n)]
    assert from_kernel == causal_tile_plan(n_q, n_k, block_m, block_n)


@pytest.mark.parametrize("n_q,n_k,block_m,block_n", SIZES)
def test_without_causality_every_key_block_is_visited(n_q, n_k, block_m, block_n):
    whole_blocks = n_k // block_n * block_n
    assert kernel_key_ranges(n_q, n_k, block_m, block_n, is_causal=False) == [[0, 0, whole_blocks, n_k]] * triton.cdiv(
        n_q, block_m)


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("n_q,n_k,block_m,block_n", SIZES)
def test_dkdv_query_ranges_cover_every_needed_tile_and_skip_masks_only_where_safe(n_q, n_k, block_m, block_n,
                                                                                 is_causal, fast_path):
    """For each key block, the loops the dK/dV pass runs (checked [lo, clean_lo), unchecked
    [clean_lo, clean_hi), checked [clean_hi, Nq); without FAST_PATH only the first, which then
    reaches Nq) visit every query block holding a query that sees these keys, none twice; an
    unchecked block is whole, inside Nq, of a whole key block, and (causal) every query in it
    sees every key."""
    for block, (lo, clean_lo, clean_hi, hi) in enumerate(kernel_query_ranges(n_q, n_k, block_m, block_n, is_causal,
                                                                             fast_path)):
        assert hi == n_q
        keys = range(block * block_n, min((block + 1) * block_n, n_k))
        checked = list(range(lo, clean_lo if fast_path else n_q, block_m))    # the kernel's own loops
        unchecked = list(range(clean_lo, clean_hi, block_m)) if fast_path else []
        checked += list(range(clean_hi, n_q, block_m)) if fast_path else []
        visited = sorted(checked + unchecked)
        assert len(set(visited)) == len(visited)                       # no query block twice
        needed = [m for m in range(0, n_q, block_m)
                  if not is_causal or any(j <= i for i in range(m, min(m + block_m, n_q)) for j in keys)]
        assert set(needed) <= set(visited) and all(m < n_q for m in visited)
        for m in unchecked:
            assert len(keys) == block_n and m + block_m <= n_q
            assert not is_causal or all(j <= i for i in range(m, m + block_m) for j in keys)


def test_inputs_whose_head_dimension_is_strided():
    """The kernels take no stride for the head dimension: the launcher hands them a copy of any
    q, k, v or dO that strides through it, so transposed views still give exact results."""
    from flashlab import assert_close, attention, reference_attention, reference_gradients

    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (torch.randn(1, 2, 16, 24, device=device).transpose(-1, -2).requires_grad_() for _ in range(3))
    assert q.shape == (1, 2, 24, 16) and q.stride(-1) != 1
    out = attention(q, k, v, is_causal=True, exact_fp32=True)
    grad_out = torch.randn(1, 2, 16, 24, device=device).transpose(-1, -2)
    out.backward(grad_out)
    assert_close(out, reference_attention(q, k, v, None, True), tol=1e-5)
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), reference_gradients(q, k, v, grad_out, None, True)):
        assert_close(got, want, tol=1e-5, what=f"d{name}")


# (Nq, Nk, BLOCK_M, BLOCK_N, is_causal, window): windows at the sequences' edges, wider than N,
# one-sided, Nq ≠ Nk both ways, ragged ends, an empty band (top-left causal, keys far ahead)
WINDOWS = [(100, 100, 32, 32, True, (20, 0)), (100, 100, 16, 32, False, (5, 37)), (97, 97, 32, 16, True, (0, 0)),
           (64, 64, 32, 32, True, (500, 0)), (70, 100, 32, 16, False, (10, -1)), (100, 70, 16, 16, False, (-1, 3)),
           (1, 1, 32, 32, True, (3, 0)), (300, 200, 64, 64, False, (0, 50)), (40, 90, 16, 16, True, (10, 0)),
           (33, 33, 16, 16, False, (0, 0))]


def _band_touches(n_q, n_k, block_m, block_n, is_causal, window):
    """Per (query block, key block) tile: does any query of the block see any key of it, and
    does every query of the block see every key of it (a whole key block)? From the band's
    boolean (Nq, Nk) mask, not from the kernels' arithmetic."""
    keep = window_keep_mask(n_q, n_k, is_causal, window)
    touched, whole = {}, {}
    for m in range(0, n_q, block_m):
        for n in range(0, n_k, block_n):
            tile = keep[m:m + block_m, n:n + block_n]
            touched[m, n] = bool(tile.any())
            whole[m, n] = bool(tile.all()) and n + block_n <= n_k
    return touched, whole


@pytest.mark.parametrize("n_q,n_k,block_m,block_n,is_causal,window", WINDOWS)
def test_windowed_forward_visits_exactly_the_band_tiles(n_q, n_k, block_m, block_n, is_causal, window):
    """`_key_range` with a window: the forward (and dQ) loops visit a key tile iff the band
    touches it, none twice, and run it unchecked only if every query of the block sees all of
    it; `causal_tile_plan(window=…)` says the same."""
    band = window_band(window, is_causal, n_q, n_k)
    touched, whole = _band_touches(n_q, n_k, block_m, block_n, is_causal, window)
    plan = []
    for m, (lo, clean_lo, clean_hi, hi) in zip(range(0, n_q, block_m),
                                               kernel_key_ranges(n_q, n_k, block_m, block_n, is_causal, band)):
        assert lo <= clean_lo <= clean_hi <= hi
        checked = list(range(lo, clean_lo, block_n)) + list(range(clean_hi, hi, block_n))
        unchecked = list(range(clean_lo, clean_hi, block_n))
        visited = checked + unchecked
        assert len(set(visited)) == len(visited)
        assert sorted(visited) == [n for n in range(0, n_k, block_n) if touched[m, n]]
        assert all(whole[m, n] for n in unchecked)
        plan.append([FULL if n in unchecked else MASKED if n in checked else SKIPPED for n in range(0, n_k, block_n)])
    assert plan == causal_tile_plan(n_q, n_k, block_m, block_n, band)
    assert sum(touched.values()) == sum(c != SKIPPED for row in plan for c in row)    # the band's tile count


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("n_q,n_k,block_m,block_n,is_causal,window", WINDOWS)
def test_windowed_dkdv_visits_exactly_the_band_tiles(n_q, n_k, block_m, block_n, is_causal, window, fast_path):
    """`_query_range` with a window: the dK/dV pass streams a query block past a key block iff
    the band touches the tile, none twice, unchecked only where every query sees every key
    and the query block is whole."""
    band = window_band(window, is_causal, n_q, n_k)
    touched, _ = _band_touches(n_q, n_k, block_m, block_n, is_causal, window)
    keep = window_keep_mask(n_q, n_k, is_causal, window)
    for n, (lo, clean_lo, clean_hi, hi) in zip(range(0, n_k, block_n), kernel_query_ranges(
            n_q, n_k, block_m, block_n, is_causal, fast_path, band)):
        checked = list(range(lo, clean_lo, block_m)) + (list(range(clean_hi, hi, block_m)) if fast_path else [])
        unchecked = list(range(clean_lo, clean_hi, block_m)) if fast_path else []
        visited = checked + unchecked
        assert len(set(visited)) == len(visited)
        assert sorted(visited) == [m for m in range(0, n_q, block_m) if touched[m, n]]
        for m in unchecked:
            assert m + block_m <= n_q and bool(keep[m:m + block_m, n:n + block_n].all())
