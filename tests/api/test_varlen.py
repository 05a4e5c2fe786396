"""varlen_attention against per-sequence float64 references: empty and length-1 sequences,
ragged lengths, GQA, causal, sliding windows (also at the sequence edges), gradients; that
tiles outside the window are really skipped (never read); bad inputs."""

import pytest
import torch

from flashlab import assert_close
from flashlab.api.varlen import (
    cu_seqlens_from_lengths,
    key_tile_range,
    reference_varlen_attention,
    varlen_block_sizes,
)
from flashlab.api.varlen import varlen_attention as _varlen_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def varlen_attention(*args, **kwargs):
    """float32 with exact products on the GPU too (TF32 would need looser tolerances)."""
    return _varlen_attention(*args, exact_fp32=True, **kwargs)


def _packed(lengths, heads, heads_k, head_dim=16, lengths_k=None, dtype=torch.float32, grad=True):
    lengths_k = lengths if lengths_k is None else lengths_k
    q = torch.randn(sum(lengths), heads, head_dim, dtype=dtype, device=DEVICE)
    k = torch.randn(sum(lengths_k), heads_k, head_dim, dtype=dtype, device=DEVICE)
    v = torch.randn(sum(lengths_k), heads_k, head_dim, dtype=dtype, device=DEVICE)
    cu_q = cu_seqlens_from_lengths(lengths, DEVICE)
    cu_k = cu_seqlens_from_lengths(lengths_k, DEVICE)
    return [t.requires_grad_(grad) for t in (q, k, v)], cu_q, cu_k, max(lengths), max(lengths_k)


def _check_forward_backward(lengths, heads, heads_k, is_causal, window, lengths_k=None, softcap=None):
    (q, k, v), cu_q, cu_k, max_q, max_k = _packed(lengths, heads, heads_k, lengths_k=lengths_k)
    out = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=is_causal, window=window, softcap=softcap)
    ref = reference_varlen_attention(q, k, v, cu_q, cu_k, is_causal=is_causal, window=window, softcap=softcap)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_close(out, ref)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad.double())
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert_close(g, w, tol=2e-5, what=name)


@pytest.mark.parametrize("is_causal", [False, True])
def test_ragged_empty_and_length_one_sequences(is_causal):
    _check_forward_backward([0, 1, 19, 40, 0], heads=2, heads_k=2, is_causal=is_causal, window=None)


@pytest.mark.parametrize("heads,heads_k", [(4, 2), (3, 1)])
def test_grouped_query_attention(heads, heads_k):
    _check_forward_backward([23, 9], heads=heads, heads_k=heads_k, is_causal=True, window=None)


@pytest.mark.parametrize("is_causal,window", [
    (True, (5, 0)),        # sliding window: itself and 5 keys before
    (True, (20, 7)),       # causal caps right at 0
    (False, (3, 3)),       # local band, both sides; the edges of each sequence cut it
    (False, (0, 0)),       # each query sees only its own key
    (False, (-1, 4)),      # unbounded left
    (False, (17, -1)),     # unbounded right
])
def test_windows_at_the_sequence_edges(is_causal, window):
    _check_forward_backward([1, 37, 6], heads=2, heads_k=1, is_causal=is_causal, window=window)


@pytest.mark.parametrize("is_causal,window", [(False, None), (True, (5, 0))])
def test_soft_capping(is_causal, window):
    """The logits capped before the band (a cap small enough to bend every score), forward and backward."""
    _check_forward_backward([1, 37, 6, 0], heads=2, heads_k=1, is_causal=is_causal, window=window, softcap=0.6)


def test_different_query_and_key_lengths_align_to_the_end():
    """Lq ≠ Lk: the diagonal is aligned to the end of the keys (FlashAttention's convention);
    a sequence with keys but no queries, and one with queries but no keys (rows of zeros)."""
    _check_forward_backward([3, 20, 0, 4], heads=2, heads_k=1, is_causal=True, window=(6, 0),
                            lengths_k=[30, 20, 5, 0])


def test_head_dim_not_power_of_two_and_scale():
    (q, k, v), cu_q, cu_k, max_q, max_k = _packed([12, 30], 2, 2, head_dim=24, grad=False)
    out = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True, scale=0.5)
    assert_close(out, reference_varlen_attention(q, k, v, cu_q, cu_k, is_causal=True, scale=0.5))


def test_half_precision():
    (q, k, v), cu_q, cu_k, max_q, max_k = _packed([17, 40], 2, 1, head_dim=32, dtype=torch.float16, grad=False)
    out = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True, window=(9, 0))
    assert out.dtype == torch.float16
    assert_close(out, reference_varlen_attention(q, k, v, cu_q, cu_k, is_causal=True, window=(9, 0)),
                 dtype=torch.float16)


def test_tiles_outside_the_window_are_never_read():
    """Keys outside the tiles a query block's band touches are NaN: if the forward or the dQ
    pass read them the block's rows would be NaN. Likewise queries outside the rows whose
    band reaches a key block are NaN for the dK/dV pass of that block."""
    window = (10, 0)
    blocks = varlen_block_sizes(DEVICE == "cuda", 16)
    block_m, block_n = blocks["forward"]["BLOCK_M"], blocks["forward"]["BLOCK_N"]
    n = 4 * max(block_m, block_n)
    (q, k, v), cu, _, _, _ = _packed([n], 1, 1, grad=False)
    first = n - block_m                                           # the last query block
    lo, hi = key_tile_range(first, n - 1, n, n, window[0], 0, block_n)
    hi = -(-hi // block_n) * block_n                               # whole tiles are read
    assert hi - lo < n, "the window must leave tiles to skip"
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[:lo], v_bad[:lo], k_bad[hi:], v_bad[hi:] = (float("nan"),) * 4
    q.requires_grad_(True)
    out = varlen_attention(q, k_bad, v_bad, cu, cu, n, n, is_causal=True, window=window)
    ref = reference_varlen_attention(q, k, v, cu, cu, is_causal=True, window=window)
    assert_close(out[first:], ref[first:], what="forward rows of the last block")
    grad = torch.randn_like(out)
    grad[:first] = 0
    dq = torch.autograd.grad(out, q, grad)[0]
    dq_ref = torch.autograd.grad(ref, q, grad.double())[0]
    if blocks["dq"]["BLOCK_M"] == block_m and blocks["dq"]["BLOCK_N"] == block_n:
        assert_close(dq[first:], dq_ref[first:], tol=2e-5, what="dq rows of the last block")

    # dK/dV of the first key block: only queries 0 .. block_n − 1 + window[0] can see it
    bm, bn = blocks["dkdv"]["BLOCK_M"], blocks["dkdv"]["BLOCK_N"]
    q_hi = -(-(bn + window[0]) // bm) * bm
    q_bad = q.detach().clone()
    q_bad[q_hi:] = float("nan")
    k.requires_grad_(True)
    v.requires_grad_(True)
    grad = torch.randn_like(out)
    grad[q_hi:] = float("nan")                                     # dO of the unread rows too
    out = varlen_attention(q_bad, k, v, cu, cu, n, n, is_causal=True, window=window)
    dk, dv = torch.autograd.grad(out, (k, v), grad)
    grad_ref = grad.double().nan_to_num(0.0)
    ref = reference_varlen_attention(q.detach(), k, v, cu, cu, is_causal=True, window=window)
    dk_ref, dv_ref = torch.autograd.grad(ref, (k, v), grad_ref)
    assert_close(dk[:bn], dk_ref[:bn], tol=2e-5, what="dk of the first key block")
    assert_close(dv[:bn], dv_ref[:bn], tol=2e-5, what="dv of the first key block")


def test_key_tile_range():
    # causal window of 10 keys, query rows 80..95, 16-key tiles: keys 70..95 → tiles from 64
    assert key_tile_range(80, 95, 96, 96, 10, 0, 16) == (64, 96)
    # no window: everything up to the diagonal
    assert key_tile_range(0, 15, 96, 96, 200, 0, 16) == (0, 16)
    # keys longer than queries: the diagonal shifts by Lk − Lq
    assert key_tile_range(0, 3, 4, 20, 2, 0, 8) == (8, 20)


@pytest.mark.gpu
def test_bfloat16_on_gpu():
    (q, k, v), cu_q, cu_k, max_q, max_k = _packed([700, 1, 333], 8, 2, head_dim=128, dtype=torch.bfloat16)
    out = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True, window=(64, 0))
    ref = reference_varlen_attention(q, k, v, cu_q, cu_k, is_causal=True, window=(64, 0))
    assert_close(out, ref, dtype=torch.bfloat16)


def test_bad_inputs_raise_clear_errors():
    (q, k, v), cu, _, n, _ = _packed([5, 7], 2, 2, grad=False)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        varlen_attention(q, k, v, cu.long(), cu, n, n)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        varlen_attention(q, k, v, cu, torch.tensor([0, 5, 11], dtype=torch.int32, device=DEVICE), n, n)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        varlen_attention(q, k, v, cu, cu, 6, n)
    with pytest.raises(ValueError, match="window"):
        varlen_attention(q, k, v, cu, cu, n, n, window=(-2, 0))
    with pytest.raises(ValueError, match="q"):
        varlen_attention(q[None], k, v, cu, cu, n, n)
    with pytest.raises(ValueError, match="k"):
        varlen_attention(q, k[:, :1].expand(12, 1, 16)[:, :, :8], v, cu, cu, n, n)
    with pytest.raises(ValueError, match="k"):
        varlen_attention(torch.randn(12, 3, 16, device=DEVICE), k, v, cu, cu, n, n)   # 2 kv heads, 3 q heads


def test_strided_offsets_and_a_strided_head_dimension_give_the_right_answer():
    """A practitioner's trial: a cu_seqlens that is a strided view (cu[::2]) was read as it lies in
    memory (relative errors of 1e19 and more, reading past its end), and a q whose head dimension
    has stride 2 gave dq and dk off by 130-200% (O took q's strides; the backward's preprocess
    reads O with its head dimension contiguous)."""
    lengths = [1, 17, 40]
    cu = cu_seqlens_from_lengths(lengths, DEVICE)
    spread = torch.zeros(2 * cu.numel(), dtype=torch.int32, device=DEVICE)
    spread[::2] = cu
    strided_cu = spread[::2]
    assert not strided_cu.is_contiguous()
    q = torch.randn(sum(lengths), 16, 2, device=DEVICE).permute(0, 2, 1).requires_grad_()   # (T, 2, 16), D stride 2
    k = torch.randn(sum(lengths), 1, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(sum(lengths), 1, 16, device=DEVICE, requires_grad=True)
    for cu_q in (cu, strided_cu):
        out = varlen_attention(q, k, v, cu_q, cu_q, 40, 40, is_causal=True)
        ref = reference_varlen_attention(q, k, v, cu, cu, is_causal=True)
        assert_close(out, ref)
        grad = torch.randn_like(out)
        for name, g, w in zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), grad),
                              torch.autograd.grad(ref, (q, k, v), grad.double())):
            assert_close(g, w, tol=2e-5, what=name)


def test_errors_name_the_entry_and_zero_heads():
    """A bad cu_seqlens was reported with all its entries, whatever the batch; zero kv heads raised
    a bare ZeroDivisionError, and a head dimension of 0 was told to split the heads."""
    (q, k, v), cu, _, n, _ = _packed([5, 7], 2, 2, grad=False)
    falling = torch.tensor([0, 5, 3, 12], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: must rise from 0 to the 12 packed tokens, but it falls "
                                         r"from 5 to 3 at entry 2\."):
        varlen_attention(q, k, v, falling, falling, n, n)
    with pytest.raises(ValueError, match="^k: has no heads"):
        varlen_attention(q, k[:, :0], v[:, :0], cu, cu, n, n)
    with pytest.raises(ValueError, match="^q: head dimension 0. Pass at least one feature per head"):
        varlen_attention(q[..., :0], k[..., :0], v[..., :0], cu, cu, n, n)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_head_dims_on_gpu(head_dim):
    (q, k, v), cu_q, cu_k, max_q, max_k = _packed([300, 1, 517], 4, 2, head_dim=head_dim, dtype=torch.float16)
    out = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True, window=(100, 0))
    ref = reference_varlen_attention(q, k, v, cu_q, cu_k, is_causal=True, window=(100, 0))
    assert_close(out, ref, dtype=torch.float16)
    grad = torch.randn_like(out)
    for name, g, w in zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), grad),
                          torch.autograd.grad(ref, (q, k, v), grad.double())):
        assert_close(g, w, tol=2 * 3e-3, what=name)


def test_a_second_derivative_raises_and_max_seqlen_must_be_an_int():
    """Found by a practitioner's trial: with create_graph=True varlen's gradients came back with no
    graph, so a gradient penalty through it silently lost its part (the weight gradient off by
    22.3 of 135). Now differentiating them again raises, as flashlab.attention does; first
    derivatives are unchanged. max_seqlen given as a numpy int was refused as "smaller than the
    longest sequence, 12" when it was 12: now the message says it must be a Python int."""
    import numpy as np
    (q, k, v), cu_q, cu_k, max_q, max_k = _packed([8, 12], 4, 2)
    out = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True)
    plain = torch.autograd.grad(out.square().sum(), (q, k, v), retain_graph=True)
    first = torch.autograd.grad(out.square().sum(), (q, k, v), create_graph=True)
    for got, want in zip(first, plain):
        assert torch.equal(got.detach(), want) and got.grad_fn is not None
    with pytest.raises(RuntimeError, match="has no second derivative"):
        sum(g.square().sum() for g in first).backward()
    for bad in (np.int64(12), torch.tensor(12), 12.0, True):
        with pytest.raises(ValueError, match="max_seqlen_q: expected a Python int"):
            varlen_attention(q, k, v, cu_q, cu_k, bad, max_k)


def test_any_finite_scale_and_none_other():
    """Any finite scale, as FlashAttention's and flashlab.attention's (0 and negative were refused)."""
    (q, k, v), cu_q, cu_k, max_q, max_k = _packed([8, 12], 2, 2, grad=False)
    for scale in (0.0, -0.5):
        assert_close(varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale),
                     reference_varlen_attention(q, k, v, cu_q, cu_k, scale=scale))
    for bad in (float("nan"), float("inf"), True, "0.5"):
        with pytest.raises(ValueError, match="scale: expected a finite number or None"):
            varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, scale=bad)


def test_torch_compile_fullgraph_forward_and_backward():
    """varlen_attention is the custom ops flashlab::varlen_forward/backward: a compiled function with
    fullgraph=True runs forward and backward (it was a graph break, and fullgraph=True failed)."""
    cu = cu_seqlens_from_lengths([5, 9], DEVICE)
    x = torch.randn(14, 2, 16, device=DEVICE, requires_grad=True)

    def loss(x):
        return varlen_attention(x, x, x, cu, cu, 9, 9, is_causal=True).square().sum() * 2

    want = loss(x)
    want_grad, = torch.autograd.grad(want, x)
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        got = torch.compile(loss, backend=backend, fullgraph=True)(x)
        got_grad, = torch.autograd.grad(got, x)
        assert_close(got, want, tol=1e-6)
        assert_close(got_grad, want_grad, tol=1e-6)


def test_torch_export_captures_one_node():
    cu = cu_seqlens_from_lengths([5, 9], DEVICE)
    x = torch.randn(14, 2, 16, device=DEVICE)

    class Layer(torch.nn.Module):
        def forward(self, x, cu):
            return _varlen_attention(x, x, x, cu, cu, 9, 9, is_causal=True, window=(3, 0))

    exported = torch.export.export(Layer(), (x, cu))
    assert [str(n.target) for n in exported.graph.nodes if "flashlab" in str(n.target)] == \
        ["flashlab.varlen_forward.default"]
    other = cu_seqlens_from_lengths([9, 5], DEVICE)          # the lengths are data: another batch, same graph
    assert_close(exported.module()(x, other), reference_varlen_attention(x, x, x, other, other, is_causal=True,
                                                                         window=(3, 0)))


@pytest.mark.parametrize("route", ["kernels", "FLASHLAB_CPU_KERNELS=0"])
def test_the_custom_ops_pass_opcheck(route, monkeypatch):
    """Schema, fake tensors, autograd registration and AOT dispatch of both ops, on the kernels and
    (CPU) on the PyTorch path; GQA, a window and a soft cap, fp16 computed in fp32 on the CPU."""
    if route != "kernels":
        if DEVICE != "cpu":
            pytest.skip("the CPU's routing")
        monkeypatch.setenv("FLASHLAB_CPU_KERNELS", "0")
    (q, k, v), cu_q, cu_k, max_q, max_k = _packed([3, 0, 11], 4, 2, lengths_k=[6, 2, 11])
    for dtype in (torch.float32, torch.float16):
        q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
        options = (True, 0.3, 4, 0, 2.0, "ieee")
        result = torch.library.opcheck(torch.ops.flashlab.varlen_forward.default,
                                       (q, k, v, cu_q, cu_k, max_q, max_k, *options))
        assert set(result.values()) == {"SUCCESS"}, result
        with torch.no_grad():
            out, lse = torch.ops.flashlab.varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, *options)
        result = torch.library.opcheck(torch.ops.flashlab.varlen_backward.default,
                                       (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, cu_q,
                                        cu_k, max_q, max_k, *options))
        assert set(result.values()) == {"SUCCESS"}, result


def test_vmap_and_autocast():
    """Inside vmap the call runs the PyTorch version (plain operations vmap understands); under autocast
    the inputs take autocast's dtype, as SDPA's do (the output was fp32 where attention gave bf16)."""
    cu = cu_seqlens_from_lengths([5, 9], DEVICE)
    x = torch.randn(3, 14, 2, 16, device=DEVICE)
    batched = torch.func.vmap(lambda a: _varlen_attention(a, a, a, cu, cu, 9, 9, is_causal=True))(x)
    for i in range(3):
        assert_close(batched[i], reference_varlen_attention(x[i], x[i], x[i], cu, cu, is_causal=True))
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = _varlen_attention(x[0], x[0], x[0], cu, cu, 9, 9, is_causal=True)
    assert out.dtype == torch.bfloat16
    assert_close(out, reference_varlen_attention(x[0], x[0], x[0], cu, cu, is_causal=True), dtype=torch.bfloat16)


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU's routing")
@pytest.mark.parametrize("route", ["FLASHLAB_CPU_KERNELS=0", "over the interpreter's tile limit"])
def test_cpu_calls_the_interpreter_should_not_run_take_the_pytorch_path(route, monkeypatch):
    """As flashlab.attention on a CPU: FLASHLAB_CPU_KERNELS=0, or more tiles than the interpreter is
    given, computes in PyTorch (fp32, one sequence at a time): outputs and gradients as the kernels',
    q's dtype, no kernel launched."""
    import flashlab.api.attention
    (q, k, v), cu_q, cu_k, max_q, max_k = _packed([0, 1, 17, 40], 4, 2)
    window = (8, 0)
    want = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True, window=window)
    grad = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (q, k, v), grad)
    if route == "FLASHLAB_CPU_KERNELS=0":
        monkeypatch.setenv("FLASHLAB_CPU_KERNELS", "0")
    else:
        monkeypatch.setattr(flashlab.api.attention, "INTERPRETER_MAX_TILES", 1)
    monkeypatch.setattr("flashlab.api.varlen.launch", lambda *a, **k: pytest.fail("a varlen kernel was launched"))
    out = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True, window=window)
    assert_close(out, want, tol=1e-5)
    for name, got, ref in zip("qkv", torch.autograd.grad(out, (q, k, v), grad), want_grads):
        assert_close(got, ref, tol=1e-5, what=f"d{name}")
    half = varlen_attention(q.half(), k.half(), v.half(), cu_q, cu_k, max_q, max_k, is_causal=True, window=window)
    assert half.dtype == torch.float16
    assert_close(half, want.half(), tol=3e-3)


def test_options_after_the_sizes_are_keyword_only():
    """FlashAttention's eighth positional argument is dropout_p: a ported call varlen_attention(q, k, v, cu,
    cu, L, L, 0.1) once ran causal attention (is_causal=0.1) without a word. Now it raises TypeError."""
    q, k, v = (torch.randn(7, 2, 16) for _ in range(3))
    cu = cu_seqlens_from_lengths([3, 4])
    with pytest.raises(TypeError, match="positional argument"):
        _varlen_attention(q, k, v, cu, cu, 4, 4, 0.1)


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU's routing")
def test_the_pytorch_paths_written_out_backward_with_a_soft_cap(monkeypatch):
    """The op's body runs below autograd, so the PyTorch path's backward is written out: its
    gradients against float64 autograd, with GQA, an empty sequence, a window and a soft cap."""
    monkeypatch.setenv("FLASHLAB_CPU_KERNELS", "0")
    (q, k, v), cu_q, cu_k, max_q, max_k = _packed([3, 0, 7], 4, 2, lengths_k=[5, 4, 7])
    out = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True, window=(2, 1), softcap=1.5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference_varlen_attention(q64, k64, v64, cu_q, cu_k, is_causal=True, window=(2, 1), softcap=1.5)
    assert_close(out, ref)
    for ours, want in zip(got, torch.autograd.grad(ref, (q64, k64, v64), grad.double())):
        assert_close(ours, want)


def test_out_of_range_cu_seqlens_read_nothing_outside_the_tensors():
    """A traced call does not check cu_seqlens' values (the graph cannot read them), so the kernels clamp
    each sequence's rows into the packed tensors: bounds past the end, negative or falling give a
    shorter (or empty) sequence, never a read or write outside q, k, v, O. Called through the op, as a
    compiled graph calls it; forward and backward."""
    (q, k, v), cu, _, _, _ = _packed([5, 9], 2, 2, grad=False)
    options = (True, 0.25, -1, -1, 0.0, "ieee")
    for bad, good in (([0, 5, 10 ** 6], [0, 5, 14]), ([-7, 5, 3], [0, 5, 5]), ([0, 2 ** 31 - 1, 14], [0, 14, 14])):
        bad, good = (torch.tensor(c, dtype=torch.int32, device=DEVICE) for c in (bad, good))
        out, lse = torch.ops.flashlab.varlen_forward(q, k, v, bad, bad, 16, 16, *options)
        want = reference_varlen_attention(q, k, v, good, good, is_causal=True, scale=0.25)
        rows = int(good[-1])                              # rows past the clamped sequences are not written
        assert_close(out[:rows], want[:rows])
        grads = torch.ops.flashlab.varlen_backward(torch.ones_like(out), q, k, v, out, lse, bad, bad, 16, 16,
                                                   *options)
        assert all(torch.isfinite(g[:rows]).all() for g in grads)
