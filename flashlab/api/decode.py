"""`decode_attention`: attention of a few new query tokens against a KV cache, contiguous or
paged, split over the keys and merged (flash-decoding), with the layouts and argument meanings
of FlashAttention's ``flash_attn_with_kvcache``, so code can switch between the two.

Why split: with seqlen_q = 1 a (batch, kv head) pair is one small tile of work per key block;
batch·heads_k programs may be far fewer than the GPU has SMs, and then most of the HBM bandwidth
sits idle. Cutting each cache into ``num_splits`` key ranges multiplies the programs; the
merge kernel then combines the partial (O, log-sum-exp) pairs exactly (notebook 03's merge).
The kernels are in `flashlab.kernels.decode`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from flashlab.kernels.constants import LOG2E
from flashlab.kernels.decode import decode_merge_kernel, decode_split_kernel
from flashlab.launch.dense import KERNEL_DTYPES, MAX_HEAD_DIM, cdiv, head_dim_args
from flashlab.launch.runtime import kernel_for
from flashlab.launch.spec import AttentionSpec
from flashlab.reference.checks import check_softcap, check_window, default_scale, finite_number, without_neg_views
from flashlab.reference.first_order import without_backward
from flashlab.reference.naive import soft_cap

from .attention import _autocast_inputs, _autocasting

MAX_SPLITS = 128          # beyond this the merge's reads stop being small next to the cache's
MIN_TILES_PER_SPLIT = 2   # a split must stream a few key tiles to pay for its Q load and merge term


def launch(kernel, grid, *args, **meta):
    """Every Triton launch of flashlab's decode and varlen kernels goes through here, so how
    kernels run (compiled, or interpreted on CPU) can be decided in one place."""
    kernel_for(kernel, args[0].device)[grid](*args, **meta)


def band(is_causal: bool, window, max_seqlen_q: int, max_seqlen_k: int) -> tuple[int, int]:
    """(left, right) as the varlen and decode kernels use it: query i sees key j iff
    −left ≤ j − (i + Lk − Lq) ≤ right (FlashAttention's alignment, to the end of the keys). An
    unbounded side (window entry −1, or no window) becomes a number no sequence reaches; causal caps
    right at 0."""
    unbounded = max_seqlen_q + max_seqlen_k + 1
    left, right = (-1, -1) if window is None else window
    left = unbounded if left < 0 else left
    right = unbounded if right < 0 else right
    if is_causal:
        right = min(right, 0)
    return left, right


def _on_gpu(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def decode_block_sizes(device_is_gpu: bool, head_dim: int = 128) -> dict:
    """Key-tile size and launch options. On a GPU with Hopper's 228 KB of shared memory per SM and
    D ≤ 128: 128-key tiles, 4 warps, 2 stages, the fastest of the 12 (tile 64/128 × warps 4/8 ×
    stages 2-4) the decode suite times for a 64k cache at batch 1 and a paged one at batch 4.
    Elsewhere 64-key tiles, 2 stages, to fit. In the interpreter larger tiles and fewer programs run faster
    (its cost is per program and per op)."""
    if device_is_gpu:
        roomy = torch.cuda.get_device_capability()[0] >= 9 and head_dim <= 128
        return dict(BLOCK_N=128, num_warps=4, num_stages=2) if roomy else dict(BLOCK_N=64, num_warps=4, num_stages=2)
    return dict(BLOCK_N=32)


def tiles_for_pages(meta: dict, page_size: int) -> dict:
    """GPU launch options for a paged cache: pages smaller than the key tile (a power of two ≥ 32)
    get tiles of one page each, so each tile reads one block-table entry and consecutive rows (the
    kernel's PAGE_ALIGNED path): under 128-key tiles every row of such a page would be gathered
    through the table (the decode suite's record has the cost of each page size). Smaller pages
    (vLLM's 16) keep the row gather."""
    if 32 <= page_size < meta["BLOCK_N"] and page_size & (page_size - 1) == 0:
        return dict(meta, BLOCK_N=page_size, num_stages=3)
    return meta


def stacked_rows_block(seqlen_q: int, group: int) -> int:
    """Rows of the stacked query tile: seqlen_q·group query rows (every q head of a kv head's
    group), padded to a power of two ≥ 16 (tl.dot's minimum), at most 64 per program."""
    return min(64, max(16, 1 << (seqlen_q * group - 1).bit_length()))


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 1 for the CPU interpreter (one program at a
    time), so the heuristic below does not split needlessly there."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def choose_num_splits(programs_without_split: int, max_seqlen_cache: int, block_n: int, num_sms: int) -> int:
    """How many key ranges to cut each cache into.

    Fill the GPU: at least two waves of programs (``programs · splits ≥ 2 · SMs``), so that while
    one program waits on HBM another is ready, and the load balances across SMs. Bounded by the
    work there is: each split gets at least ``MIN_TILES_PER_SPLIT`` key tiles (a split has to
    amortise loading Q and writing its partial (O, L), which the merge reads back), and at most
    ``MAX_SPLITS`` splits. Enough programs already (large batch·heads_k): one split, no merge.
    """
    if programs_without_split >= 2 * num_sms:
        return 1
    wanted = math.ceil(2 * num_sms / max(1, programs_without_split))
    tiles = cdiv(max(1, max_seqlen_cache), block_n)
    return splits_with_tiles(tiles, max(1, min(wanted, tiles // MIN_TILES_PER_SPLIT, MAX_SPLITS)))


def splits_with_tiles(tiles: int, splits: int) -> int:
    """``splits`` less the ones that would get no key tile. The kernel deals whole tiles,
    ceil(tiles / splits) to each split (512 tiles in 33 splits is 16 each, so 32 splits carry them
    and a 33rd stays empty); more splits than tiles only add empty programs and partial rows the
    merge reads back."""
    return cdiv(tiles, cdiv(tiles, min(splits, tiles)))


def _fail(argument: str, problem: str, fix: str) -> None:
    raise ValueError(f"{argument}: {problem}. {fix}")


def _check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, check_contents):
    """Shapes, dtypes and devices always; the *contents* of cache_seqlens and block_table only when
    ``check_contents``: reading them from the GPU is a host synchronisation on every decoding step
    (and is forbidden inside a CUDA-graph capture), which FlashAttention does not pay either."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            _fail(name, f"expected a torch.Tensor, got {type(t).__name__}", "Pass a 4-D tensor.")
        if t.dim() != 4:
            _fail(name, f"expected 4 dimensions, got shape {tuple(t.shape)}",
                  "q is (batch, seqlen_q, heads, D); the cache (batch, seqlen_cache, heads_k, D), "
                  "or (num_blocks, page_size, heads_k, D) with a block_table")
        if t.dtype not in KERNEL_DTYPES:
            _fail(name, f"dtype {t.dtype} is not supported", "Use float16, bfloat16 or float32.")
        if t.device != q.device:
            _fail(name, f"is on {t.device} but q is on {q.device}", f"Move it with {name}.to(q.device).")
        if t.dtype != q.dtype:
            _fail(name, f"dtype {t.dtype} differs from q's {q.dtype}", f"Cast it with {name}.to(q.dtype).")
        if t.stride(-1) != 1:
            _fail(name, "its last (head) dimension is not contiguous", f"Pass {name}.contiguous().")
    if k_cache.shape != v_cache.shape:
        _fail("v_cache", f"shape {tuple(v_cache.shape)} differs from k_cache's {tuple(k_cache.shape)}",
              "Keys and values need one row each per cached token, with the same head dimension.")
    batch, seqlen_q, heads, head_dim = q.shape
    heads_k = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        _fail("k_cache", f"head dimension {k_cache.shape[3]} differs from q's {head_dim}",
              "q and the cache must have the same last dimension.")
    if head_dim > MAX_HEAD_DIM:
        _fail("q", f"head dimension {head_dim} exceeds {MAX_HEAD_DIM}", "Split the heads.")
    if seqlen_q == 0 or head_dim == 0:
        _fail("q", f"has an empty dimension, shape {tuple(q.shape)}",
              "Pass at least one query token, one head and a head dimension of at least 1.")
    if heads == 0 or heads_k == 0:
        _fail("k_cache" if heads else "q", f"has no heads (q {heads}, k_cache {heads_k})",
              "Pass at least one head in q and in the cache.")
    if heads % heads_k:
        transposed = q.shape[1] % heads_k == 0 and q.shape[1] > heads    # q given as (batch, heads, seqlen_q, D)?
        _fail("k_cache", f"has {heads_k} heads, which does not divide q's {heads} (q's dimension 2)",
              "q is (batch, seqlen_q, heads, D): if yours is (batch, heads, seqlen_q, D), pass q.transpose(1, 2)."
              if transposed else "Grouped-query attention needs heads_k to divide heads.")
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.shape != (batch,) or \
            cache_seqlens.dtype not in (torch.int32, torch.int64):
        _fail("cache_seqlens", f"expected an integer tensor of shape ({batch},), got "
              f"{getattr(cache_seqlens, 'dtype', type(cache_seqlens).__name__)} "
              f"{tuple(getattr(cache_seqlens, 'shape', ()))}",
              "Pass torch.tensor(lengths, dtype=torch.int32, device=q.device), one cached length per sequence.")
    if cache_seqlens.device != q.device:
        _fail("cache_seqlens", f"is on {cache_seqlens.device} but q is on {q.device}",
              "Move it with cache_seqlens.to(q.device).")
    if block_table is None:
        if k_cache.shape[0] != batch:
            _fail("k_cache", f"holds {k_cache.shape[0]} sequences but q has batch {batch}",
                  "A contiguous cache is (batch, seqlen_cache, heads_k, D); for a paged cache pass block_table.")
        capacity = k_cache.shape[1]
    else:
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or \
                block_table.dim() != 2 or block_table.shape[0] != batch:
            _fail("block_table", f"expected an int32 tensor (batch={batch}, max_pages), got "
                  f"{getattr(block_table, 'dtype', type(block_table).__name__)} "
                  f"{tuple(getattr(block_table, 'shape', ()))}",
                  "Row b lists the physical cache blocks of sequence b in order, as torch.int32.")
        if block_table.device != q.device:
            _fail("block_table", f"is on {block_table.device} but q is on {q.device}",
                  "Move it with block_table.to(q.device).")
        if check_contents and block_table.numel():
            # only the pages a sequence uses are read: entries past them may hold anything (e.g. −1)
            pages_used = (cache_seqlens.to(torch.int64).clamp(min=0) + k_cache.shape[1] - 1) // k_cache.shape[1]
            used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] < pages_used[:, None]
            bad = used & ((block_table < 0) | (block_table >= k_cache.shape[0]))
            if bad.any():
                _fail("block_table", f"a page that holds cached tokens points outside [0, {k_cache.shape[0]}) "
                      f"(sequence {int(bad.nonzero()[0, 0])})",
                      "Each sequence's first ceil(length / page_size) entries must index a block of "
                      "k_cache / v_cache (num_blocks, page_size, heads_k, D); entries past them are not read.")
        capacity = block_table.shape[1] * k_cache.shape[1]
    if check_contents and cache_seqlens.numel() and (cache_seqlens.min() < 0 or cache_seqlens.max() > capacity):
        first = int(((cache_seqlens < 0) | (cache_seqlens > capacity)).nonzero()[0, 0])    # one, not the batch
        _fail("cache_seqlens", f"lengths must lie in [0, {capacity}], got {int(cache_seqlens[first])} for "
              f"sequence {first}",
              "A length cannot exceed what the cache (or its block table's pages) holds.")
    if num_splits is not None and not (isinstance(num_splits, int) and 1 <= num_splits):
        _fail("num_splits", f"expected a positive integer, or None (or 0) to choose, got {num_splits!r}",
              "Leave it None for the heuristic, or pass e.g. 4.")
    if scale is not None and not finite_number(scale):       # any finite scale, as FlashAttention's
        _fail("scale", f"expected a finite number or None, got {scale!r}", "Leave it None for 1/sqrt(D).")


def decode_attention(q, k_cache, v_cache, cache_seqlens, *, block_table=None, num_splits=None, scale=None,
                     causal=False, window=None, softcap=None, return_lse=False, check_contents=None,
                     launch_options=None):
    """Attention of new query tokens against a KV cache (FlashAttention's ``flash_attn_with_kvcache``).

    The tensors' layouts and the meanings of cache_seqlens, block_table, causal, the window,
    num_splits and the returned log-sum-exp are FlashAttention's. What differs: every option after
    cache_seqlens is keyword-only (FlashAttention's fourth positional argument is the new ``k``: a
    ported positional call raises TypeError instead of taking a tensor for another option), ``scale``
    for ``softmax_scale``, ``window`` for ``window_size``, cache_seqlens a tensor (not an int), and no
    appending of new k/v to the cache.
    `flashlab.flash_attn_interface.flash_attn_with_kvcache` has FlashAttention's own signature
    (appending included) on this function.

    Args:
        q: ``(batch, seqlen_q, heads, D)``, float16 / bfloat16 / float32.
        k_cache, v_cache: ``(batch, seqlen_cache, heads_k, D)`` (any strides, but the head
            dimension contiguous: views and stride-0 expanded heads are read as they are), or paged
            ``(num_blocks, page_size, heads_k, D)`` with ``block_table``; ``heads_k`` divides
            ``heads`` (grouped-query attention: q head h reads kv head h // (heads / heads_k)).
        cache_seqlens: int32 (or int64) ``(batch,)``: how many cached tokens sequence b has (0 allowed:
            its output rows are zeros).
        block_table: int32 ``(batch, max_pages)``: row b lists the physical blocks holding
            sequence b's tokens 0..page_size−1, page_size..2·page_size−1, … (entries past the
            sequence's last page are not read).
        num_splits: key ranges per cache (split-KV); None (or 0, FlashAttention's spelling) picks one
            by `choose_num_splits`. At most one per key tile is used: a larger number gives the same
            result with the empty splits left out.
        scale: default 1/sqrt(D).
        causal: query i is the token at position cache_seqlens − seqlen_q + i and sees keys up to
            it (aligned to the end of the cache, as FlashAttention); no effect when seqlen_q = 1.
            Default False, as FlashAttention's: pass causal=True for several new tokens of one
            sequence.
        window: ``(left, right)``, FlashAttention's sliding window: query i (at position
            cache_seqlens − seqlen_q + i) sees the keys from its position − left to its position + right,
            −1 unbounded on that side; with causal, right is 0. Key tiles outside it are skipped.
        softcap: the logits soft-capped, cap·tanh(x/cap), before the causal mask (Gemma 2's);
            None for none.
        return_lse: also return the natural-log log-sum-exp ``(batch, heads, seqlen_q)`` float32
            (−inf for rows with no key), as ``flash_attn_with_kvcache(return_softmax_lse=True)``.
        check_contents: check that every length fits the cache and every block index exists, and
            raise if not. Default: for eager CPU calls yes; on a GPU (and in traced calls) no, because
            reading the values back stops the host until the GPU catches up on every decoding step
            (and cannot happen inside a CUDA-graph capture), as in FlashAttention. Unchecked, nothing
            outside the cache is read whatever the values: the kernels clamp each length into
            0..capacity and take a block index outside 0..num_blocks − 1 as a missing page whose keys
            take no part. Pass ``check_contents=True`` while developing to hear of such values.
        launch_options: override the kernel's tile size and launch options (BLOCK_N, num_warps,
            num_stages), for tuning experiments; default `decode_block_sizes`.

    Returns:
        ``(batch, seqlen_q, heads, D)`` in q's dtype (and the log-sum-exp if asked). Inference only:
        the kernels have no backward, so a backward through the output raises (use
        `flashlab.attention` where gradients are needed).

    On a CPU the kernels run in Triton's interpreter, as `flashlab.attention`'s do, up to its tile
    limit; larger calls, and every call with ``FLASHLAB_CPU_KERNELS=0``, take `decode_by_sequence`
    (PyTorch, fp32, one sequence at a time). The kernels are the custom op ``flashlab::decode_forward``:
    ``torch.compile(fullgraph=True)`` and ``torch.export`` capture a call as one node, with no host
    synchronisation (a compiled step replays in a CUDA graph with new cache_seqlens). Under
    ``torch.autocast`` q and the cache are cast to autocast's dtype, as SDPA's inputs are (keep the
    cache in that dtype: a cast copies it). Inside ``torch.func`` transforms (vmap…) it raises:
    the batch dimension is already there.
    """
    compiling = torch.compiler.is_compiling()
    if not compiling and (torch._C._are_functorch_transforms_active() or torch._C._is_tracing()):
        raise RuntimeError("decode_attention: torch.func transforms (vmap, grad) and torch.jit.trace are not "
                           "supported; pass the batch as q's first dimension (batch, seqlen_q, heads, D) instead.")
    eager = type(q) is torch.Tensor and not compiling
    if check_contents is None:
        check_contents = eager and q.device.type == "cpu"
    elif check_contents and not eager:
        raise ValueError("check_contents: a traced call (torch.compile, torch.export) cannot read cache_seqlens "
                         "and block_table. Check them eagerly while developing; traced calls read inside bounds.")
    if launch_options and not eager:
        raise ValueError("launch_options: for eager tuning experiments only; leave it None under torch.compile "
                         "and torch.export.")
    if num_splits == 0:
        num_splits = None                               # FlashAttention's 0 = "choose for me"
    if isinstance(q, torch.Tensor) and _autocasting(q):    # as flashlab.attention and SDPA under autocast
        q, k_cache, v_cache, _ = _autocast_inputs(q, k_cache, v_cache, None)
    _check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, check_contents)
    check_window(window)
    args = (q, k_cache, v_cache, cache_seqlens, block_table, num_splits or 0, default_scale(q.shape[-1], scale),
            causal, *(window or (-1, -1)), check_softcap(softcap))
    if not eager:                                       # traced: the custom op
        out, lse = torch.ops.flashlab.decode_forward(*args)
        return (out, lse) if return_lse else out
    q, k_cache, v_cache = without_neg_views(q, k_cache, v_cache)     # the kernels read storage
    results = _decode(q, k_cache, v_cache, *args[3:], want_lse=return_lse, launch_options=launch_options)
    # the kernels have no backward: a backward through their output raises instead of stopping there
    results = without_backward(results if return_lse else results[:1], (q, k_cache, v_cache), NO_BACKWARD)
    return results if return_lse else results[0]


def _decode(q, k_cache, v_cache, cache_seqlens, block_table, num_splits: int, scale: float, causal: bool,
            window_left: int, window_right: int, softcap: float, want_lse: bool = True, launch_options=None):
    """The op's body: (O laid out as q, in q's dtype; the natural-log log-sum-exp (batch, heads, seqlen_q)
    fp32, −inf for a row with no key; None instead when not ``want_lse``, an eager call that did not ask).
    Nothing here reads cache_seqlens or block_table on the host (but the CPU's PyTorch path)."""
    if q.device.type == "cpu" and q.dtype != torch.float32:
        # the interpreter's fp16/bf16 arithmetic is not the GPU's (bf16 sums come out wrong, ~1e9):
        # computed in fp32 and cast back, as flashlab.attention and varlen_attention do on the CPU
        out, lse = _decode(q.float(), k_cache.float(), v_cache.float(), cache_seqlens, block_table, num_splits,
                           scale, causal, window_left, window_right, softcap, want_lse, launch_options)
        return _laid_out_as(out, q), lse
    if q.device.type == "cpu" and not _interpreted_kernels_take(q, k_cache, block_table):
        # as flashlab.attention on a CPU: the PyTorch path (fp32, one sequence at a time) for calls too large for
        # the interpreter, or for every call with FLASHLAB_CPU_KERNELS=0
        out, lse = decode_by_sequence(q, k_cache, v_cache, cache_seqlens, block_table, scale, causal, torch.float32,
                                      softcap, (window_left, window_right))
        return _laid_out_as(out, q), lse
    batch, seqlen_q, heads, head_dim = q.shape
    heads_k = k_cache.shape[2]
    group = heads // heads_k
    # fp32: exact products (decoding is memory-bound); 16-bit inputs ignore the flag
    spec = AttentionSpec(scale, causal, softcap=softcap, precision="ieee")
    gpu = _on_gpu(q)
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else 1
    meta = decode_block_sizes(gpu, head_dim)
    if paged and gpu:
        meta = tiles_for_pages(meta, page_size)
    meta = {**meta, **(launch_options or {})}
    block_m = stacked_rows_block(seqlen_q, group)
    row_blocks = cdiv(seqlen_q * group, block_m)
    # the heuristic sizes splits by the cache's capacity, not max(cache_seqlens): the lengths live on
    # the GPU, and reading them would stop the host every step (FlashAttention does the same)
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    if not num_splits:
        num_splits = choose_num_splits(batch * heads_k * row_blocks, capacity, meta["BLOCK_N"], sm_count(q.device))
    else:              # a caller's number too (num_splits=10**6 asked for 256 MB of partial rows)
        num_splits = splits_with_tiles(cdiv(max(1, capacity), meta["BLOCK_N"]), num_splits)
    seqlens = cache_seqlens.to(torch.int32).contiguous()     # the kernel reads seqlens[z], no stride
    table = block_table if paged else seqlens          # any pointer: PAGED=False never reads it
    table_strides = block_table.stride() if paged else (0, 0)
    out = torch.empty_like(q)
    lse = torch.empty(batch, seqlen_q, heads, dtype=torch.float32, device=q.device)
    block_d = head_dim_args(head_dim)["BLOCK_D"]
    (qk_scale, softcap_base2, _, _), flags = spec.kernel_args(seqlen_q, capacity)
    left, right = band(causal, (window_left, window_right), seqlen_q, capacity)
    has_band = causal or (window_left, window_right) != (-1, -1)
    if num_splits > 1:
        o_part = torch.empty(batch * seqlen_q * heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        lse_part = torch.empty(batch * seqlen_q * heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        o_part, lse_part = out, lse                      # not read: the split kernel writes the result
    if batch:
        launch(decode_split_kernel, (num_splits * row_blocks * batch * heads_k,),
               q, k_cache, v_cache, seqlens, table, out, lse, o_part, lse_part,
               *q.stride(), *k_cache.stride(), *v_cache.stride(), *table_strides, *out.stride(),
               heads_k, seqlen_q, head_dim, group, num_splits, page_size, capacity, k_cache.shape[0],
               qk_scale, softcap_base2, left, right,
               PAGED=paged, PAGE_ALIGNED=paged and page_size % meta["BLOCK_N"] == 0, HAS_BAND=has_band,
               SOFTCAP=flags["SOFTCAP"], WRITE_FINAL=num_splits == 1,
               BLOCK_M=block_m, BLOCK_D=block_d, INPUT_PRECISION=spec.precision, **meta)
        if num_splits > 1:
            n_rows = batch * seqlen_q * heads
            block_r = 64 if gpu else 32
            launch(decode_merge_kernel, (cdiv(n_rows, block_r),),
                   o_part, lse_part, out, lse, *out.stride(), n_rows, seqlen_q, heads, head_dim, num_splits,
                   BLOCK_R=block_r, BLOCK_D=block_d)
    if not want_lse:
        return out, None
    # log2 → ln (ln x = log2 x / log2 e), (batch, seqlen_q, heads) → contiguous (batch, heads, seqlen_q): one kernel
    return out, torch.mul(lse.permute(0, 2, 1), 1 / LOG2E,
                          out=torch.empty(batch, heads, seqlen_q, dtype=torch.float32, device=q.device))


def _laid_out_as(result, like):
    """``result`` in ``torch.empty_like(like)``'s layout and dtype, the one the op's fake promises."""
    if result.dtype == like.dtype and result.stride() == like.stride():
        return result
    return torch.empty_like(like).copy_(result)


def _decode_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor, block_table: Tensor | None,
               num_splits: int, scale: float, causal: bool, window_left: int, window_right: int,
               softcap: float) -> tuple[Tensor, Tensor]:
    return _decode(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, causal, window_left,
                   window_right, softcap)


# flashlab::decode_forward(q, k_cache, v_cache, cache_seqlens, block_table?, num_splits, scale, causal, window_left,
#                          window_right, softcap) -> (out, lse): what torch.compile and torch.export see of a
#     call (num_splits 0: chosen; window −1, −1: none; softcap 0: none)
decode_forward = torch.library.custom_op("flashlab::decode_forward", mutates_args=())(_decode_op)


@decode_forward.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, scale, causal, window_left, window_right, softcap):
    batch, seqlen_q, heads, _ = q.shape
    return torch.empty_like(q), q.new_empty(batch, heads, seqlen_q, dtype=torch.float32)


def _raise_no_backward(grad_out: Tensor, like: Tensor) -> Tensor:
    raise RuntimeError(NO_BACKWARD)


# the backward is this op, which raises when it runs: raising while the backward is traced would make
# torch.compile refuse a decoding step whose q merely requires grad, though nothing differentiates it
decode_no_backward = torch.library.custom_op("flashlab::decode_no_backward", mutates_args=())(_raise_no_backward)
decode_no_backward.register_fake(lambda grad_out, like: torch.empty_like(like))


def _no_backward(ctx, grad_out, grad_lse):
    """A gradient for q, k_cache and v_cache that raises when computed (never a silent None)."""
    inputs = ctx.saved_tensors
    return *(torch.ops.flashlab.decode_no_backward(grad_out, t) if ctx.needs_input_grad[i] else None
             for i, t in enumerate(inputs)), *(None,) * 8


def _save_inputs(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(*inputs[:3])


decode_forward.register_autograd(_no_backward, setup_context=_save_inputs)


NO_BACKWARD = ("decode_attention has no backward (its kernels are for inference): compute attention that "
               "needs gradients with flashlab.attention, or run decoding under torch.no_grad().")


def reference_decode_attention(q, k_cache, v_cache, cache_seqlens, block_table=None, scale=None, causal=False,
                               softcap=None, window=None):
    """The ground truth in float64, one sequence at a time: gathers sequence b's cache rows
    (through its pages if paged), repeats kv heads for GQA, masks keys after each query's
    position (aligned to the end of the cache) and outside the window, softmax, weighted sum.
    Rows with no key: 0."""
    return decode_by_sequence(q, k_cache, v_cache, cache_seqlens, block_table, scale, causal, torch.float64,
                              check_softcap(softcap), window)[0]


def _interpreted_kernels_take(q, k_cache, block_table) -> bool:
    """A CPU call: whether the kernels run (in Triton's interpreter) rather than `decode_by_sequence`,
    by the rule of `flashlab.attention`: ``FLASHLAB_CPU_KERNELS`` unset or 1, and at most
    ``INTERPRETER_MAX_TILES`` tiles of 32 stacked query rows × 32 keys of the cache's capacity."""
    from flashlab.launch.interpreter_notice import INTERPRETER_BLOCK

    from .attention import interpreted_tiles_allowed
    batch, seqlen_q, heads, _ = q.shape
    capacity = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]
    heads_k = k_cache.shape[2]
    tiles = batch * heads_k * cdiv(seqlen_q * (heads // heads_k), INTERPRETER_BLOCK) * cdiv(capacity,
                                                                                             INTERPRETER_BLOCK)
    return interpreted_tiles_allowed(tiles)


def decode_by_sequence(q, k_cache, v_cache, cache_seqlens, block_table, scale, causal, dtype, softcap=0.0,
                       window=None):
    """Decoding one sequence at a time in plain PyTorch, computed in ``dtype``: (out in ``dtype``, the
    natural-log log-sum-exp (batch, heads, seqlen_q) float32, −inf where a row has no key). The
    float64 reference, and (fp32) `decode_attention`'s PyTorch path on a CPU."""
    batch, seqlen_q, heads, head_dim = q.shape
    scale = default_scale(head_dim, scale)
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    lse = torch.full((batch, heads, seqlen_q), float("-inf"), dtype=torch.float32, device=q.device)
    capacity = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]
    for b in range(batch):
        # as the kernels: a length outside 0..capacity is clamped into it, and a block-table entry outside
        # 0..num_blocks − 1 names no page (its keys take no part): nothing outside the cache is read
        n = min(max(int(cache_seqlens[b]), 0), capacity)
        present = torch.ones(n, dtype=torch.bool, device=q.device)
        if block_table is None:
            k, v = k_cache[b, :n], v_cache[b, :n]
        else:
            pages = block_table[b, :cdiv(n, k_cache.shape[1])].long()
            exists = (pages >= 0) & (pages < k_cache.shape[0])
            present = exists.repeat_interleave(k_cache.shape[1])[:n]
            pages = pages.where(exists, 0)
            if k_cache.shape[0] == 0:                          # no block at all: no key either
                n, present, pages = 0, present[:0], pages[:0]
            k, v = k_cache[pages].flatten(0, 1)[:n], v_cache[pages].flatten(0, 1)[:n]
        group = heads // k.shape[1]
        k = k.to(dtype).repeat_interleave(group, dim=1).transpose(0, 1)       # (heads, n, D)
        v = v.to(dtype).repeat_interleave(group, dim=1).transpose(0, 1)
        qb = q[b].to(dtype).transpose(0, 1)                                   # (heads, seqlen_q, D)
        scores = soft_cap(qb @ k.transpose(-1, -2) * scale, softcap)
        position = n - seqlen_q + torch.arange(seqlen_q, device=q.device)
        left, right = band(causal, window, seqlen_q, capacity)
        rel = torch.arange(n, device=q.device)[None, :] - position[:, None]          # key − query position
        keep = (rel >= -left) & (rel <= right) & present[None, :]
        scores = scores.masked_fill(~keep, float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)                # empty rows: 0, not NaN
        out[b] = (weights @ v).transpose(0, 1)
        lse[b] = torch.logsumexp(scores, dim=-1).float()                       # −inf for a row with no key
    return out, lse
