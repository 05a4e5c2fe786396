"""decode_attention against per-sequence float64 references: contiguous and paged caches
(pages shuffled), empty and length-1 caches, ragged lengths, GQA, seqlen_q 1 and > 1,
one split and many; the log-sum-exp; the split heuristic; bad inputs."""

import pytest
import torch

from flashlab import assert_close
from flashlab.api.decode import (
    choose_num_splits,
    decode_attention,
    reference_decode_attention,
)
from flashlab.lessons.traffic import decode_flops, decode_traffic

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _cache(batch, capacity, heads_k, head_dim, dtype=torch.float32):
    shape = (batch, capacity, heads_k, head_dim)
    return torch.randn(shape, dtype=dtype, device=DEVICE), torch.randn(shape, dtype=dtype, device=DEVICE)


def _paged(lengths, page_size, heads_k, head_dim, spare_blocks=3, dtype=torch.float32):
    """A paged cache with every sequence's pages scattered in a shuffled pool of blocks."""
    pages = [-(-n // page_size) for n in lengths]
    max_pages = max(1, max(pages))
    num_blocks = sum(pages) + spare_blocks
    k = torch.randn(num_blocks, page_size, heads_k, head_dim, dtype=dtype, device=DEVICE)
    v = torch.randn(num_blocks, page_size, heads_k, head_dim, dtype=dtype, device=DEVICE)
    pool = torch.randperm(num_blocks).tolist()
    table = torch.zeros(len(lengths), max_pages, dtype=torch.int32)
    for b, n in enumerate(pages):
        table[b, :n] = torch.tensor(pool[:n], dtype=torch.int32)
        pool = pool[n:]
    return k, v, table.to(DEVICE)


def _lengths(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("num_splits", [1, 3, 16, None])
@pytest.mark.parametrize("heads,heads_k", [(2, 2), (4, 2), (4, 1)])
def test_contiguous_ragged_lengths(num_splits, heads, heads_k):
    lengths = [0, 1, 37, 96]                  # empty, one key, ragged, a whole number of tiles
    q = torch.randn(len(lengths), 1, heads, 16, device=DEVICE)
    k, v = _cache(len(lengths), 100, heads_k, 16)
    out = decode_attention(q, k, v, _lengths(lengths), num_splits=num_splits)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_close(out, reference_decode_attention(q, k, v, _lengths(lengths)))
    assert (out[0] == 0).all(), "a sequence with an empty cache must give zeros"


@pytest.mark.parametrize("num_splits", [1, 5])
@pytest.mark.parametrize("page_size", [16, 8, 64])   # 64: whole key tiles per page (CPU 32, GPU 64)
def test_paged_shuffled_pages(num_splits, page_size):
    lengths = [45, 1, 0, 64]
    k, v, table = _paged(lengths, page_size, heads_k=2, head_dim=16)
    q = torch.randn(len(lengths), 1, 4, 16, device=DEVICE)
    out = decode_attention(q, k, v, _lengths(lengths), block_table=table, num_splits=num_splits)
    assert_close(out, reference_decode_attention(q, k, v, _lengths(lengths), block_table=table))


@pytest.mark.parametrize("causal", [False, True])
def test_soft_capping(causal):
    """The logits capped before the causal mask, every split alike (a cap small enough to bend every score)."""
    lengths = [45, 1, 0, 64]
    k, v, table = _paged(lengths, 16, heads_k=2, head_dim=16)
    q = torch.randn(len(lengths), 3, 4, 16, device=DEVICE)
    for num_splits in (1, 3):
        out = decode_attention(q, k, v, _lengths(lengths), block_table=table, num_splits=num_splits, causal=causal,
                               softcap=0.6)
        assert_close(out, reference_decode_attention(q, k, v, _lengths(lengths), block_table=table, causal=causal,
                                                     softcap=0.6))


def test_paged_equals_contiguous():
    """The same tokens in a contiguous and in a shuffled paged cache give the same output."""
    lengths = [30, 17]
    k, v, table = _paged(lengths, 8, heads_k=1, head_dim=16, spare_blocks=0)
    contiguous_k = torch.stack([k[table[b].long()].flatten(0, 1) for b in range(2)])
    contiguous_v = torch.stack([v[table[b].long()].flatten(0, 1) for b in range(2)])
    q = torch.randn(2, 1, 2, 16, device=DEVICE)
    paged = decode_attention(q, k, v, _lengths(lengths), block_table=table, num_splits=2)
    flat = decode_attention(q, contiguous_k, contiguous_v, _lengths(lengths), num_splits=2)
    assert_close(paged, flat, tol=1e-6)


@pytest.mark.parametrize("seqlen_q", [2, 5])
@pytest.mark.parametrize("paged", [False, True])
def test_several_new_tokens_causal_to_the_end_of_the_cache(seqlen_q, paged):
    """Query i sees keys ≤ length − seqlen_q + i; a cache shorter than seqlen_q leaves the first
    rows with no key (zeros)."""
    lengths = [40, 3, 1]
    heads, heads_k = 6, 2
    q = torch.randn(len(lengths), seqlen_q, heads, 16, device=DEVICE)
    if paged:
        k, v, table = _paged(lengths, 16, heads_k, 16)
    else:
        (k, v), table = _cache(len(lengths), 48, heads_k, 16), None
    ref = reference_decode_attention(q, k, v, _lengths(lengths), block_table=table, causal=True)
    for num_splits in (1, 3):
        out = decode_attention(q, k, v, _lengths(lengths), block_table=table, num_splits=num_splits, causal=True)
        assert_close(out, ref)
    non_causal = decode_attention(q, k, v, _lengths(lengths), block_table=table)    # FlashAttention's default
    assert_close(non_causal, reference_decode_attention(q, k, v, _lengths(lengths), block_table=table,
                                                        causal=False))
    assert (non_causal - out).abs().max() > 1e-3, "causal and not must differ for seqlen_q > 1"


def test_many_stacked_rows_use_several_row_blocks():
    """seqlen_q · group = 8 · 16 = 128 rows: more than one stacked tile per kv head."""
    q = torch.randn(1, 8, 16, 16, device=DEVICE)
    k, v = _cache(1, 50, 1, 16)
    out = decode_attention(q, k, v, _lengths([50]), num_splits=2)
    assert_close(out, reference_decode_attention(q, k, v, _lengths([50])))


def test_log_sum_exp_and_head_dim_not_power_of_two():
    lengths = [33, 0]
    q = torch.randn(2, 1, 2, 24, device=DEVICE)
    k, v = _cache(2, 40, 2, 24)
    out, lse = decode_attention(q, k, v, _lengths(lengths), num_splits=4, scale=0.3, return_lse=True)
    assert_close(out, reference_decode_attention(q, k, v, _lengths(lengths), scale=0.3))
    scores = torch.einsum("hd,nhd->hn", q[0, 0].double(), k[0, :33].double()) * 0.3
    assert lse.shape == (2, 2, 1)
    assert_close(lse[0, :, 0], torch.logsumexp(scores, -1), what="lse")
    assert torch.isneginf(lse[1]).all(), "an empty cache has log-sum-exp −inf"


def test_half_precision():
    dtype = torch.float16                     # bf16: GPU only (wrong in the interpreter)
    q = torch.randn(2, 1, 4, 32, dtype=dtype, device=DEVICE)
    k, v = _cache(2, 70, 2, 32, dtype=dtype)
    out = decode_attention(q, k, v, _lengths([70, 9]), num_splits=3)
    assert out.dtype == dtype
    assert_close(out, reference_decode_attention(q, k, v, _lengths([70, 9])), dtype=dtype)


def test_bfloat16_everywhere():
    """bf16 on CPU is computed in fp32 (the interpreter's bf16 sums are wrong: ~1e9 before this
    was fixed); on a GPU in bf16. Both within bf16's tolerance of float64, lse included."""
    q = torch.randn(2, 3, 4, 16, dtype=torch.bfloat16, device=DEVICE)
    k, v = _cache(2, 40, 2, 16, dtype=torch.bfloat16)
    out, lse = decode_attention(q, k, v, _lengths([40, 7]), num_splits=2, causal=True, return_lse=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert_close(out, reference_decode_attention(q, k, v, _lengths([40, 7]), causal=True), dtype=torch.bfloat16)
    fp32 = decode_attention(q.float(), k.float(), v.float(), _lengths([40, 7]), num_splits=2, causal=True,
                            return_lse=True)[1]
    assert_close(lse, fp32, tol=1e-2, what="lse")


def test_block_table_entries_past_the_last_page_are_not_checked_or_read():
    """FlashAttention-style −1 padding after a sequence's last page is accepted; a −1 inside the
    pages a sequence uses is refused (on CPU, or with check_contents=True)."""
    k, v, table = _paged([10, 16], 8, heads_k=1, head_dim=16, spare_blocks=0)
    q = torch.randn(2, 1, 2, 16, device=DEVICE)
    padded = torch.cat([table, torch.full((2, 2), -1, dtype=torch.int32, device=table.device)], 1)
    out = decode_attention(q, k, v, _lengths([10, 16]), block_table=padded, check_contents=True)
    assert_close(out, reference_decode_attention(q, k, v, _lengths([10, 16]), block_table=table))
    broken = padded.clone()
    broken[1, 1] = -1                                                # page 1 of sequence 1 holds tokens 8..15
    with pytest.raises(ValueError, match="block_table: a page that holds cached tokens"):
        decode_attention(q, k, v, _lengths([10, 16]), block_table=broken, check_contents=True)


def test_pages_smaller_than_the_key_tile_get_tiles_of_one_page():
    from flashlab.api.decode import tiles_for_pages
    h200 = dict(BLOCK_N=128, num_warps=4, num_stages=2)
    assert tiles_for_pages(h200, 64) == dict(BLOCK_N=64, num_warps=4, num_stages=3)
    assert tiles_for_pages(h200, 32)["BLOCK_N"] == 32
    assert tiles_for_pages(h200, 256) == h200 and tiles_for_pages(h200, 128) == h200   # whole tiles per page
    assert tiles_for_pages(h200, 16) == h200 and tiles_for_pages(h200, 48) == h200     # row gather


def test_num_splits_zero_means_choose():
    q = torch.randn(1, 1, 2, 16, device=DEVICE)
    k, v = _cache(1, 64, 2, 16)
    assert_close(decode_attention(q, k, v, _lengths([64]), num_splits=0),
                 decode_attention(q, k, v, _lengths([64]), num_splits=None), tol=1e-6)


def test_more_splits_than_tiles_are_dropped():
    # 100 keys are 2-4 key tiles: a million splits would ask for a partial (O, L) buffer of
    # 2·2·10^6·16 floats (256 MB) and a million empty programs; the extra splits are left out
    q = torch.randn(2, 1, 2, 16, device=DEVICE)
    k, v = _cache(2, 100, 2, 16)
    lengths = _lengths([100, 9])
    reference = reference_decode_attention(q, k, v, lengths)
    for num_splits in (4, 10**6):
        out = decode_attention(q, k, v, lengths, num_splits=num_splits)
        assert_close(out, reference)


@pytest.mark.gpu
def test_bfloat16_on_gpu():
    q = torch.randn(2, 1, 8, 128, dtype=torch.bfloat16, device=DEVICE)
    k, v = _cache(2, 5000, 2, 128, dtype=torch.bfloat16)
    out = decode_attention(q, k, v, _lengths([5000, 77]))
    assert_close(out, reference_decode_attention(q, k, v, _lengths([5000, 77])), dtype=torch.bfloat16)


def test_split_heuristic():
    # plenty of programs already: no split
    assert choose_num_splits(programs_without_split=300, max_seqlen_cache=65536, block_n=64, num_sms=132) == 1
    # batch 1, 8 kv heads, 64k cache: enough splits for two waves on 132 SMs
    splits = choose_num_splits(8, 65536, 64, 132)
    assert 8 * splits >= 0.95 * 2 * 132 and splits <= 128      # about two waves (33 asked, 32 carry the tiles)
    for programs, cache in ((8, 65536), (8, 65536 + 64), (3, 5000), (1, 64 * 37)):
        splits, tiles = choose_num_splits(programs, cache, 64, 132), -(-cache // 64)
        per = -(-tiles // splits)                               # the kernel's whole tiles per split
        assert (splits - 1) * per < tiles, f"an empty split: {splits} splits of {per} tiles for {tiles}"
    # a short cache cannot be split finer than its tiles allow
    assert choose_num_splits(1, 100, 64, 132) == 1
    assert choose_num_splits(1, 64 * 10, 64, 132) == 5


def test_decode_traffic_is_the_cache():
    steps = decode_traffic(1, 1, 8, 8, 128, 65536, torch.float16)
    cache = next(s for s in steps if "cache" in s.name)
    assert cache.total == 2 * 65536 * 8 * 128 * 2
    # one query per kv head at fp16: 4·D FLOPs per key against 2·2·D bytes of K and V: 1 FLOP/byte
    intensity = decode_flops(1, 1, 8, 128, 65536) / sum(s.total for s in steps)
    assert 0.99 < intensity < 1.0
    # a group of 8 q heads shares each K/V read: 8× the intensity
    grouped = decode_flops(1, 1, 8, 128, 65536) / sum(s.total for s in decode_traffic(1, 1, 8, 1, 128, 65536))
    assert 7.9 < grouped < 8.0
    assert len(decode_traffic(1, 1, 8, 8, 128, 65536, num_splits=4)) == 3


def test_bad_inputs_raise_clear_errors():
    q = torch.randn(2, 1, 4, 16, device=DEVICE)
    k, v = _cache(2, 32, 2, 16)
    ok = _lengths([3, 4])
    with pytest.raises(ValueError, match="cache_seqlens"):
        decode_attention(q, k, v, [3, 4])
    with pytest.raises(ValueError, match="cache_seqlens"):
        decode_attention(q, k, v, _lengths([3, 33]), check_contents=True)   # longer than the cache
    with pytest.raises(ValueError, match="k_cache"):
        decode_attention(q, k[:, :, :1].expand(2, 32, 3, 16), v, ok)  # 3 kv heads do not divide 4
    with pytest.raises(ValueError, match=r"q\.transpose\(1, 2\)"):
        decode_attention(q.transpose(1, 2), k, v, ok)                  # (batch, heads, 1, D) by mistake
    with pytest.raises(ValueError, match="v_cache"):
        decode_attention(q, k, v[:, :16], ok)
    with pytest.raises(ValueError, match="q"):
        decode_attention(q[0], k, v, ok)
    with pytest.raises(ValueError, match="num_splits"):
        decode_attention(q, k, v, ok, num_splits=-1)          # (0 is FlashAttention's "choose")
    with pytest.raises(ValueError, match="block_table"):
        decode_attention(q, k, v, ok, block_table=torch.zeros(2, 2, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="block_table"):
        decode_attention(q, k, v, ok, block_table=torch.full((2, 2), 5, dtype=torch.int32, device=DEVICE),
                         check_contents=True)
    with pytest.raises(ValueError, match="k_cache"):
        decode_attention(q, k.double(), v, ok)


def test_strided_cache_lengths_are_read_as_their_values():
    """A practitioner's trial: an int32 cache_seqlens that is a strided view (x[::2]) was read by the
    kernel as it lies in memory (lengths 5, 0, 33 for 5, 33, 64), silently; int64 worked only
    because the cast to int32 copied it."""
    lengths = torch.tensor([5, 0, 33, 0, 64, 0], dtype=torch.int32, device=DEVICE)[::2]
    assert not lengths.is_contiguous()
    q = torch.randn(3, 1, 4, 16, device=DEVICE)
    k, v = _cache(3, 70, 2, 16)
    for num_splits in (1, 3):
        assert_close(decode_attention(q, k, v, lengths, num_splits=num_splits),
                     reference_decode_attention(q, k, v, lengths.contiguous()))


def test_errors_name_one_bad_length_and_zero_heads():
    """A bad length among a thousand was reported with all of them (3,122 characters); zero heads
    raised a bare ZeroDivisionError."""
    q = torch.randn(1000, 1, 2, 16, device=DEVICE)
    k, v = _cache(1000, 8, 2, 16)
    lengths = torch.full((1000,), 3, dtype=torch.int32, device=DEVICE)
    lengths[617] = 9
    with pytest.raises(ValueError) as error:
        decode_attention(q, k, v, lengths, check_contents=True)
    assert str(error.value).startswith("cache_seqlens: lengths must lie in [0, 8], got 9 for sequence 617.")
    assert len(str(error.value)) < 200, str(error.value)
    with pytest.raises(ValueError, match="^k_cache: has no heads"):
        decode_attention(q[:2], k[:2, :, :0], v[:2, :, :0], lengths[:2])
    with pytest.raises(ValueError, match="^q: has no heads"):
        decode_attention(q[:2, :, :0], k[:2], v[:2], lengths[:2])


def test_contents_checked_by_default_on_cpu_only():
    """On CPU the lengths are checked without being asked; on a GPU only when asked, since
    reading them back would stop the host on every decoding step."""
    q = torch.randn(1, 1, 2, 16)
    k, v = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="cache_seqlens"):
        decode_attention(q, k, v, torch.tensor([9], dtype=torch.int32))


@pytest.mark.gpu
def test_decode_step_captures_in_a_cuda_graph():
    """A decoding step has no host synchronisation: it captures in a CUDA graph, and replaying
    the graph after the cache grew gives the new answer."""
    lengths = _lengths([100, 700])
    q = torch.randn(2, 1, 8, 64, device=DEVICE, dtype=torch.bfloat16)
    k, v = _cache(2, 1024, 2, 64, dtype=torch.bfloat16)
    decode_attention(q, k, v, lengths)                                   # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, k, v, lengths)
    lengths.copy_(_lengths([101, 1024]))
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference_decode_attention(q, k, v, lengths), tol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_head_dims_on_gpu(head_dim):
    lengths = [3000, 1, 0]
    k, v, table = _paged(lengths, 256, heads_k=2, head_dim=head_dim, dtype=torch.float16)
    q = torch.randn(3, 2, 8, head_dim, dtype=torch.float16, device=DEVICE)
    out = decode_attention(q, k, v, _lengths(lengths), block_table=table)
    assert_close(out, reference_decode_attention(q, k, v, _lengths(lengths), block_table=table), dtype=torch.float16)


def test_no_backward_is_said_not_a_silent_stop():
    """decode_attention has no backward. Its output used to come back without a graph when q
    required grad, so a loss through it silently got no gradient from attention (a practitioner's
    trial); now a backward through it raises, and under no_grad nothing changes."""
    k, v = _cache(2, 20, 2, 16)
    q = torch.randn(2, 1, 4, 16, device=DEVICE, requires_grad=True)
    lengths = _lengths([5, 20])
    out = decode_attention(q, k, v, lengths)
    assert out.requires_grad
    assert_close(out, reference_decode_attention(q, k, v, lengths))
    with pytest.raises(RuntimeError, match="decode_attention has no backward"):
        out.sum().backward()
    with torch.no_grad():
        assert not decode_attention(q, k, v, lengths).requires_grad
    out, lse = decode_attention(q.detach(), k, v, lengths, return_lse=True)
    assert not out.requires_grad and lse.shape == (2, 4, 1)


def test_any_finite_scale_and_none_other():
    """Any finite scale, as FlashAttention's and flashlab.attention's (0 and negative were refused)."""
    k, v = _cache(2, 20, 2, 16)
    q = torch.randn(2, 1, 2, 16, device=DEVICE)
    lengths = _lengths([5, 20])
    for scale in (0.0, -0.5):
        assert_close(decode_attention(q, k, v, lengths, scale=scale),
                     reference_decode_attention(q, k, v, lengths, scale=scale))
    for bad in (float("nan"), float("inf"), True, "0.5"):
        with pytest.raises(ValueError, match="scale: expected a finite number or None"):
            decode_attention(q, k, v, lengths, scale=bad)


def test_torch_compile_fullgraph_with_new_lengths_and_no_backward():
    """decode_attention is the custom op flashlab::decode_forward: a compiled step with fullgraph=True runs
    (it was a graph break, and fullgraph=True failed), and the lengths are data: new cache_seqlens, the
    same graph, the new answer. With q requiring grad it still compiles; a backward raises when run."""
    q = torch.randn(2, 1, 4, 16, device=DEVICE)
    k_cache, v_cache = _cache(2, 40, 2, 16)
    lengths = torch.tensor([17, 40], dtype=torch.int32, device=DEVICE)

    def step(q, k_cache, v_cache, lengths):
        return decode_attention(q, k_cache, v_cache, lengths) * 2

    want = step(q, k_cache, v_cache, lengths)
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        compiled = torch.compile(step, backend=backend, fullgraph=True)
        assert torch.equal(compiled(q, k_cache, v_cache, lengths), want)
        shorter = _lengths([3, 9])
        assert_close(compiled(q, k_cache, v_cache, shorter) / 2, reference_decode_attention(q, k_cache, v_cache,
                                                                                              shorter))
    out = compiled(q.clone().requires_grad_(), k_cache, v_cache, lengths)
    with pytest.raises(RuntimeError, match="decode_attention has no backward"):
        out.sum().backward()
    torch._dynamo.reset()
    with pytest.raises(Exception, match="check_contents: a traced call"):     # it cannot read the values there
        torch.compile(lambda q: decode_attention(q, k_cache, v_cache, lengths, check_contents=True),
                      backend="eager", fullgraph=True)(q)


@pytest.mark.parametrize("paged", [False, True])
def test_torch_export_captures_one_node(paged):
    lengths = [17, 40]
    if paged:
        k_cache, v_cache, table = _paged(lengths, 16, 2, 16)
    else:
        (k_cache, v_cache), table = _cache(2, 40, 2, 16), None
    q = torch.randn(2, 2, 4, 16, device=DEVICE)

    class Step(torch.nn.Module):
        def forward(self, q, k_cache, v_cache, lengths, table):
            return decode_attention(q, k_cache, v_cache, lengths, block_table=table, causal=True, return_lse=True)

    exported = torch.export.export(Step(), (q, k_cache, v_cache, _lengths(lengths), table))
    assert [str(n.target) for n in exported.graph.nodes if "flashlab" in str(n.target)] == \
        ["flashlab.decode_forward.default"]
    out, lse = exported.module()(q, k_cache, v_cache, _lengths([5, 33]), table)
    assert_close(out, reference_decode_attention(q, k_cache, v_cache, _lengths([5, 33]), block_table=table,
                                                 causal=True))
    assert lse.shape == (2, 4, 2) and lse.is_contiguous()


@pytest.mark.parametrize("case", ["contiguous", "paged fp16 softcap window", "FLASHLAB_CPU_KERNELS=0"])
def test_the_custom_op_passes_opcheck(case, monkeypatch):
    """Schema, fake tensor, autograd registration and AOT dispatch: contiguous and paged caches, fp16
    (computed in fp32 on the CPU), and the CPU's PyTorch path."""
    lengths = _lengths([0, 9, 31])
    q = torch.randn(3, 2, 4, 16, device=DEVICE)
    if case.startswith("paged"):
        k_cache, v_cache, table = _paged([0, 9, 31], 8, 2, 16)
        q, k_cache, v_cache = q.half(), k_cache.half(), v_cache.half()
        softcap, window = 3.0, (5, 0)
    else:
        (k_cache, v_cache), table, softcap, window = _cache(3, 31, 2, 16), None, 0.0, (-1, -1)
    if case == "FLASHLAB_CPU_KERNELS=0":
        if DEVICE != "cpu":
            pytest.skip("the CPU's routing")
        monkeypatch.setenv("FLASHLAB_CPU_KERNELS", "0")
    result = torch.library.opcheck(torch.ops.flashlab.decode_forward.default,
                                   (q, k_cache, v_cache, lengths, table, 2, 0.25, True, *window, softcap))
    assert set(result.values()) == {"SUCCESS"}, result


def test_vmap_raises_in_one_line_and_autocast_casts():
    q = torch.randn(2, 1, 4, 16, device=DEVICE)
    k_cache, v_cache = _cache(2, 40, 2, 16)
    lengths = _lengths([17, 40])
    with pytest.raises(RuntimeError, match=r"^decode_attention: torch.func transforms \(vmap, grad\)"):
        torch.func.vmap(lambda a: decode_attention(a, k_cache, v_cache, lengths))(q[None].expand(3, -1, -1, -1, -1))
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = decode_attention(q, k_cache, v_cache, lengths)
    assert out.dtype == torch.bfloat16
    assert_close(out, reference_decode_attention(q, k_cache, v_cache, lengths), dtype=torch.bfloat16)


@pytest.mark.gpu
def test_a_compiled_step_with_appending_captures_in_a_cuda_graph():
    """A decoding step through flash_attn_with_kvcache (append the new k/v at cache_seqlens, then attend),
    compiled with fullgraph=True and captured in a CUDA graph on a fixed-capacity cache: replays with
    advancing cache_seqlens give the eager answers."""
    from flashlab.flash_attn_interface import flash_attn_with_kvcache
    k_cache, v_cache = _cache(2, 256, 2, 64, dtype=torch.bfloat16)
    lengths = _lengths([10, 100])
    q, k_new, v_new = (torch.randn(2, 1, h, 64, device=DEVICE, dtype=torch.bfloat16) for h in (8, 2, 2))

    def step(q, k_new, v_new, lengths):
        return flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lengths, causal=True)

    compiled = torch.compile(step, fullgraph=True)
    compiled(q, k_new, v_new, lengths)                                   # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(q, k_new, v_new, lengths)
    for _ in range(3):
        lengths += 1
        q.copy_(torch.randn_like(q))
        k_new.copy_(torch.randn_like(k_new))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, reference_decode_attention(q, k_cache, v_cache, lengths + 1, causal=True), tol=2e-2)


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU's routing")
@pytest.mark.parametrize("route", ["FLASHLAB_CPU_KERNELS=0", "over the interpreter's tile limit"])
@pytest.mark.parametrize("paged", [False, True])
def test_cpu_calls_the_interpreter_should_not_run_take_the_pytorch_path(route, paged, monkeypatch):
    """As flashlab.attention on a CPU: FLASHLAB_CPU_KERNELS=0, or more tiles than the interpreter is
    given, computes in PyTorch (fp32): the same output and log-sum-exp within fp32 rounding, q's dtype."""
    import flashlab.api.attention
    lengths = [0, 1, 37, 64]
    if paged:
        k_cache, v_cache, table = _paged(lengths, 16, 2, 16)
    else:
        (k_cache, v_cache), table = _cache(4, 64, 2, 16), None
    q = torch.randn(4, 3, 4, 16)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    want_out, want_lse = decode_attention(q, k_cache, v_cache, seqlens, block_table=table, causal=True, return_lse=True)
    if route == "FLASHLAB_CPU_KERNELS=0":
        monkeypatch.setenv("FLASHLAB_CPU_KERNELS", "0")
    else:
        monkeypatch.setattr(flashlab.api.attention, "INTERPRETER_MAX_TILES", 1)
    monkeypatch.setattr("flashlab.api.decode.launch", lambda *a, **k: pytest.fail("a decoding kernel was launched"))
    out, lse = decode_attention(q, k_cache, v_cache, seqlens, block_table=table, causal=True, return_lse=True)
    assert_close(out, want_out, tol=1e-5)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    assert_close(lse.nan_to_num(neginf=0.0), want_lse.nan_to_num(neginf=0.0), tol=1e-5)
    half = decode_attention(q.half(), k_cache.half(), v_cache.half(), seqlens, block_table=table, causal=True)
    assert half.dtype == torch.float16
    assert_close(half, want_out.half(), tol=3e-3)


def test_options_after_cache_seqlens_are_keyword_only():
    """FlashAttention's fourth positional argument is the new k: a tensor passed there must not become
    another option (block_table), so every option after cache_seqlens is keyword-only."""
    q = torch.randn(2, 1, 4, 16, device=DEVICE)
    k_cache, v_cache = _cache(2, 20, 2, 16)
    with pytest.raises(TypeError, match="positional argument"):
        decode_attention(q, k_cache, v_cache, _lengths([5, 20]), torch.zeros(2, 1, dtype=torch.int32))


@pytest.mark.parametrize("route, page", [("kernels", 8), ("kernels", 32), ("FLASHLAB_CPU_KERNELS=0", 8)])
def test_out_of_range_lengths_and_pages_read_nothing_outside_the_cache(route, page, monkeypatch):
    """Memory-safe by construction, with the contents unchecked (the GPU's default): a length outside
    0..capacity is clamped into it (past the end: the whole cache; negative: no key, zeros), and a
    block-table entry outside 0..num_blocks − 1 names no page (its keys take no part). Before, such
    inputs segfaulted or returned other memory's contents (absmax 1.6e38). Every output is then a
    weighted mean of cache rows, so bounded by the cache's largest value. Pages of 32 keys are whole key
    tiles in the interpreter (one table entry per tile), pages of 8 are gathered row by row."""
    if route != "kernels":
        if DEVICE != "cpu":
            pytest.skip("the CPU's routing")
        monkeypatch.setenv("FLASHLAB_CPU_KERNELS", "0")
    heads_k, d = 2, 16
    k_pool, v_pool = torch.randn(6, page, heads_k, d, device=DEVICE), torch.randn(6, page, heads_k, d, device=DEVICE)
    q = torch.randn(5, 1, 4, d, device=DEVICE)
    big = 2**31 - 1
    table = torch.tensor([[0, 1, 2], [3, -1, 4], [5, big, 0], [1, 2, 3], [4, 5, 0]], dtype=torch.int32,
                         device=DEVICE)
    lengths = _lengths([big, 3 * page, 2 * page + 4, -7, page + 1])
    out = decode_attention(q, k_pool, v_pool, lengths, block_table=table, check_contents=False)
    assert torch.isfinite(out).all() and out.abs().max() <= v_pool.abs().max()

    def over(rows_k, rows_v, b):      # sequence b over the given cache rows, float64
        return reference_decode_attention(q[b:b + 1], rows_k[None], rows_v[None], _lengths([rows_k.shape[0]]))[0]

    rows = lambda pool, pages: pool[torch.tensor(pages, device=DEVICE)].flatten(0, 1)    # noqa: E731
    assert_close(out[0], over(rows(k_pool, [0, 1, 2]), rows(v_pool, [0, 1, 2]), 0))      # length 2³¹−1: the capacity
    assert_close(out[1], over(rows(k_pool, [3, 4]), rows(v_pool, [3, 4]), 1))            # page −1: its keys left out
    keys_2 = torch.cat([torch.arange(page), 2 * page + torch.arange(4)])                 # page 2³¹−1 likewise
    assert_close(out[2], over(rows(k_pool, [5, 0, 0])[keys_2], rows(v_pool, [5, 0, 0])[keys_2], 2))
    assert torch.equal(out[3], torch.zeros_like(out[3]))                                 # negative length: no key
    assert_close(out[4], over(rows(k_pool, [4, 5])[:page + 1], rows(v_pool, [4, 5])[:page + 1], 4))
    # a contiguous cache: a length past the end reads its own row only, not the next sequence's
    k_cache, v_cache = _cache(2, 12, heads_k, d)
    out = decode_attention(q[:2], k_cache, v_cache, _lengths([40, -1]), check_contents=False)
    assert_close(out[0], over(k_cache[0], v_cache[0], 0))
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    # the full check stays available for debugging
    with pytest.raises(ValueError, match="block_table"):
        decode_attention(q, k_pool, v_pool, lengths, block_table=table, check_contents=True)


@pytest.mark.parametrize("route", ["kernels", "FLASHLAB_CPU_KERNELS=0"])
@pytest.mark.parametrize("causal, window", [(True, (40, 0)), (False, (7, 3)), (True, (0, 0))])
def test_sliding_window_paged_split_and_grouped(route, causal, window, monkeypatch):
    """A window over a paged cache, cut into splits, several new queries stacked with their group: against
    the float64 reference and, independently, against varlen's float64 reference on the gathered rows.
    Key tiles before the window are skipped (a split with no tile left gives no key, and merges away)."""
    from flashlab.api.varlen import cu_seqlens_from_lengths, reference_varlen_attention
    if route != "kernels":
        if DEVICE != "cpu":
            pytest.skip("the CPU's routing")
        monkeypatch.setenv("FLASHLAB_CPU_KERNELS", "0")
    lengths = [0, 3, 90, 130]
    k, v, table = _paged(lengths, 16, heads_k=2, head_dim=16)
    q = torch.randn(4, 3, 4, 16, device=DEVICE)
    out = decode_attention(q, k, v, _lengths(lengths), block_table=table, num_splits=4, causal=causal, window=window)
    assert_close(out, reference_decode_attention(q, k, v, _lengths(lengths), block_table=table, causal=causal,
                                                 window=window))
    for b, n in enumerate(lengths[1:], start=1):
        rows = torch.arange(n, device=DEVICE)
        kb, vb = (t[table[b].long()[rows // 16], rows % 16] for t in (k, v))
        want = reference_varlen_attention(q[b], kb, vb, cu_seqlens_from_lengths([3], DEVICE),
                                          cu_seqlens_from_lengths([n], DEVICE), is_causal=causal, window=window)
        assert_close(out[b], want)
