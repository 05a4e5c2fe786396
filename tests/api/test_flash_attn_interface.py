"""Porting test: calls written for FlashAttention 2's ``flash_attn_interface`` (positional and keyword,
its names and defaults) run unchanged against `flashlab.flash_attn_interface` and match a float64
reference computed one sequence at a time, bottom-right causal with Nq ≠ Nk included; the new k/v
appended into the cache in place; arguments flashlab does not implement raise NotImplementedError
naming them."""

import pytest
import torch

from flashlab import assert_close
from flashlab.api.varlen import cu_seqlens_from_lengths, reference_varlen_attention
from flashlab.flash_attn_interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _randn(*shape, requires_grad=False):
    return torch.randn(*shape, device=DEVICE, requires_grad=requires_grad)


def _reference(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, softmax_scale=None):
    """float64, per sequence, FlashAttention's bottom-right alignment: (B, Nq, H, D) from (B, N, H, D)
    tensors, through the varlen reference on the batch packed back to back."""
    batch, n_q, n_k = q.shape[0], q.shape[1], k.shape[1]
    cu_q = cu_seqlens_from_lengths([n_q] * batch, device=q.device)
    cu_k = cu_seqlens_from_lengths([n_k] * batch, device=q.device)
    out = reference_varlen_attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, is_causal=causal,
                                     scale=softmax_scale, window=window_size, softcap=softcap or None)
    return out.view(batch, n_q, *out.shape[1:])


def _lse_reference(q, k, causal=False, window_size=(-1, -1), softcap=0.0, softmax_scale=None):
    """float64 natural-log log-sum-exp per row, (B, H, Nq), bottom-right band."""
    qd, kd = q.double().transpose(1, 2), k.double().transpose(1, 2)
    kd = kd.repeat_interleave(qd.shape[1] // kd.shape[1], 1)
    s = qd @ kd.transpose(-1, -2) * (softmax_scale or q.shape[-1] ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = q.shape[1], k.shape[1]
    left, right = window_size
    right = 0 if causal else right
    rel = torch.arange(n_k, device=q.device)[None] - torch.arange(n_q, device=q.device)[:, None] - (n_k - n_q)
    keep = ((rel >= -left) | (left < 0)) & ((rel <= right) | (right < 0))
    return torch.logsumexp(s.masked_fill(~keep, float("-inf")), -1)


@pytest.mark.parametrize("call, causal, window, softcap, scale", [
    (lambda q, k, v: flash_attn_func(q, k, v), False, (-1, -1), 0.0, None),
    (lambda q, k, v: flash_attn_func(q, k, v, 0.0, 0.3, True), True, (-1, -1), 0.0, 0.3),      # positional
    (lambda q, k, v: flash_attn_func(q, k, v, causal=True, window_size=(4, 0)), True, (4, 0), 0.0, None),
    (lambda q, k, v: flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(3, 2),
                                     softcap=5.0, alibi_slopes=None, deterministic=True), False, (3, 2), 5.0, None),
])
@pytest.mark.parametrize("n_q, n_k", [(5, 13), (13, 13), (9, 4)])
def test_flash_attn_func_matches_the_bottom_right_reference(call, causal, window, softcap, scale, n_q, n_k):
    """GQA (6 q heads, 2 kv heads); Nq < Nk (a chunk after cached keys), Nq = Nk, Nq > Nk (the first
    rows see no key under causal: zeros, as FlashAttention)."""
    q, k, v = _randn(2, n_q, 6, 16), _randn(2, n_k, 2, 16), _randn(2, n_k, 2, 16)
    out = call(q, k, v)
    assert out.shape == (2, n_q, 6, 16)
    assert_close(out, _reference(q, k, v, causal, window, softcap, scale))


def test_bottom_right_causal_is_not_top_left():
    """The port's trap: SDPA's is_causal is top-left; FlashAttention's causal with Nq < Nk lets every
    query see the cached keys before it. The two differ here, and flash_attn_func gives the latter."""
    q, k, v = _randn(1, 3, 2, 16), _randn(1, 11, 2, 16), _randn(1, 11, 2, 16)
    out = flash_attn_func(q, k, v, causal=True)
    top_left = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    assert (out - top_left).abs().max() > 0.1
    assert_close(out, _reference(q, k, v, causal=True))


def test_return_attn_probs_gives_the_log_sum_exp_and_gradients_flow():
    q, k, v = _randn(2, 7, 4, 16, requires_grad=True), _randn(2, 10, 2, 16), _randn(2, 10, 2, 16)
    out, lse, probs = flash_attn_func(q, k, v, causal=True, softcap=3.0, return_attn_probs=True)
    assert probs is None and lse.shape == (2, 4, 7) and lse.dtype == torch.float32
    assert_close(lse, _lse_reference(q.detach(), k, causal=True, softcap=3.0))
    out.sum().backward()
    qd = q.detach().double().requires_grad_()
    _reference(qd, k, v, causal=True, softcap=3.0).sum().backward()
    assert_close(q.grad, qd.grad)


def test_qkvpacked_positional_and_with_a_window():
    qkv = _randn(2, 11, 3, 4, 16)
    want = _reference(*qkv.unbind(2), causal=True)
    assert_close(flash_attn_qkvpacked_func(qkv, 0.0, None, True), want)
    assert_close(flash_attn_qkvpacked_func(qkv, causal=True, window_size=(3, 0)),
                 _reference(*qkv.unbind(2), causal=True, window_size=(3, 0)))
    # window (-1, 0) without causal is the same band as causal, and must not take the packed op's is_causal=False
    assert_close(flash_attn_qkvpacked_func(qkv, window_size=(-1, 0)), want)


def test_the_packed_forms():
    """kvpacked (batch, N, 2, H_k, D) and the varlen qkvpacked (total, 3, H, D) / kvpacked (total, 2, H_k, D)
    forms, positional as FlashAttention's callers write them."""
    q, kv = _randn(2, 5, 4, 16), _randn(2, 9, 2, 2, 16)
    assert_close(flash_attn_kvpacked_func(q, kv, 0.0, None, True), _reference(q, *kv.unbind(2), causal=True))
    lengths = [6, 1, 9]
    cu = cu_seqlens_from_lengths(lengths, DEVICE)
    qkv = _randn(16, 3, 4, 16)
    assert_close(flash_attn_varlen_qkvpacked_func(qkv, cu, 9, 0.0, None, True),
                 reference_varlen_attention(*qkv.unbind(1), cu, cu, is_causal=True))
    q, kv = _randn(16, 4, 16), _randn(20, 2, 2, 16)
    cu_k = cu_seqlens_from_lengths([8, 3, 9], DEVICE)
    assert_close(flash_attn_varlen_kvpacked_func(q, kv, cu, cu_k, 9, 9, causal=True, window_size=(2, 0)),
                 reference_varlen_attention(q, *kv.unbind(1), cu, cu_k, is_causal=True, window=(2, 0)))


def _packed(lengths_q, lengths_k, heads=4, heads_k=2, d=16):
    q, k, v = _randn(sum(lengths_q), heads, d), _randn(sum(lengths_k), heads_k, d), _randn(sum(lengths_k), heads_k, d)
    return q, k, v, cu_seqlens_from_lengths(lengths_q, DEVICE), cu_seqlens_from_lengths(lengths_k, DEVICE)


def test_flash_attn_varlen_func_positional_and_keyword():
    lengths_q, lengths_k = [3, 0, 9, 1], [7, 5, 9, 12]
    q, k, v, cu_q, cu_k = _packed(lengths_q, lengths_k)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 12, 0.0, None, True)
    assert_close(out, reference_varlen_attention(q, k, v, cu_q, cu_k, is_causal=True))
    out, lse, probs = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=9,
                                             max_seqlen_k=12, causal=True, window_size=(2, 0), softcap=4.0,
                                             return_attn_probs=True)
    assert_close(out, reference_varlen_attention(q, k, v, cu_q, cu_k, is_causal=True, window=(2, 0), softcap=4.0))
    assert probs is None and lse.shape == (4, sum(lengths_q))
    for b, (a, e) in enumerate(zip(cu_q.tolist()[:-1], cu_q.tolist()[1:])):
        ka, ke = cu_k[b].item(), cu_k[b + 1].item()
        want = _lse_reference(q[None, a:e], k[None, ka:ke], causal=True, window_size=(2, 0), softcap=4.0)[0]
        assert_close(lse[:, a:e], want)


def _cache_case(lengths, capacity=24, heads=4, heads_k=2, d=16):
    q = _randn(len(lengths), 1, heads, d)
    k_cache, v_cache = _randn(len(lengths), capacity, heads_k, d), _randn(len(lengths), capacity, heads_k, d)
    return q, k_cache, v_cache, torch.tensor(lengths, dtype=torch.int32, device=DEVICE)


def _cache_reference(q, k_cache, v_cache, lengths, causal=False, softcap=0.0, softmax_scale=None,
                     window_size=(-1, -1)):
    """Sequence b is its first lengths[b] cache rows: the dense reference, one sequence at a time."""
    return torch.cat([_reference(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], causal=causal,
                                 softcap=softcap, softmax_scale=softmax_scale, window_size=window_size)
                      for b, n in enumerate(lengths)])


def test_kvcache_read_only_positional_and_keyword():
    lengths = [5, 24, 1]
    q, k_cache, v_cache, seqlens = _cache_case(lengths)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, None, None, None, None, seqlens)
    assert_close(out, _cache_reference(q, k_cache, v_cache, lengths))
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, softmax_scale=0.2, softcap=2.0,
                                       num_splits=0, return_softmax_lse=True)
    assert_close(out, _cache_reference(q, k_cache, v_cache, lengths, softcap=2.0, softmax_scale=0.2))
    assert lse.shape == (3, 4, 1)
    assert_close(flash_attn_with_kvcache(q, k_cache, v_cache), _cache_reference(q, k_cache, v_cache, [24] * 3))


@pytest.mark.parametrize("causal, window_size", [(True, (5, 0)), (False, (3, 2)), (True, (0, 0)), (False, (-1, 1))])
def test_kvcache_sliding_window(causal, window_size):
    """FlashAttention's window in flash_attn_with_kvcache, bottom right: query i of 3 new tokens sees the
    cached keys from its position − left to its position + right (causal: + 0)."""
    lengths = [4, 24, 11]
    q, k_cache, v_cache, seqlens = _cache_case(lengths)
    q = _randn(3, 3, 4, 16)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=causal, window_size=window_size,
                                  num_splits=3)
    assert_close(out, _cache_reference(q, k_cache, v_cache, lengths, causal=causal, window_size=window_size))


def test_kvcache_appends_new_tokens_in_place_then_attends_causally():
    """Three new tokens per sequence written at cache_seqlens (contiguous, then paged and through
    cache_batch_idx), then causal attention of the three over the grown cache: query i is the token at
    cache_seqlens + i (bottom right). cache_seqlens itself is left for the caller to advance."""
    lengths = [4, 0, 17]
    q, k_cache, v_cache, seqlens = _cache_case(lengths)
    q = _randn(3, 3, 4, 16)
    k_new, v_new = _randn(3, 3, 2, 16), _randn(3, 3, 2, 16)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths):
        k_want[b, n:n + 3], v_want[b, n:n + 3] = k_new[b], v_new[b]
    grown = [n + 3 for n in lengths]
    want = _cache_reference(q, k_want, v_want, grown, causal=True)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, causal=True)
    assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)
    assert seqlens.tolist() == lengths
    assert_close(out, want)

    # the same sequences in a shuffled pool of 8-token pages
    page, max_pages = 8, 3
    pool_k, pool_v = _randn(10, page, 2, 16), _randn(10, page, 2, 16)
    table = torch.randperm(10, device=DEVICE)[:9].view(3, max_pages).to(torch.int32)
    for b, n in enumerate(lengths):
        rows = torch.arange(n, device=DEVICE)
        blocks = table[b].long()[rows // page]
        pool_k[blocks, rows % page], pool_v[blocks, rows % page] = k_want[b, :n], v_want[b, :n]
    out = flash_attn_with_kvcache(q, pool_k, pool_v, k_new, v_new, cache_seqlens=seqlens, block_table=table,
                                  causal=True)
    assert_close(out, want)
    for b, n in enumerate(grown):
        rows = torch.arange(n, device=DEVICE)
        assert torch.equal(pool_k[table[b].long()[rows // page], rows % page], k_want[b, :n])

    # cache_batch_idx: sequence b lives in row idx[b] of a larger cache
    idx = torch.tensor([4, 0, 2], dtype=torch.int32, device=DEVICE)
    big_k, big_v = _randn(5, 24, 2, 16), _randn(5, 24, 2, 16)
    big_k[idx.long()], big_v[idx.long()] = k_want, v_want
    others = big_k[[1, 3]].clone()
    big_k[idx.long()[:, None], torch.tensor(lengths)[:, None] + torch.arange(3)] = 0.0   # the new rows: not yet
    out = flash_attn_with_kvcache(q, big_k, big_v, k_new, v_new, cache_seqlens=seqlens, cache_batch_idx=idx,
                                  causal=True)
    assert_close(out, want)
    assert torch.equal(big_k[idx.long()], k_want) and torch.equal(big_k[[1, 3]], others)   # written in its rows only


@pytest.mark.parametrize("call, name", [
    (lambda q, k, v: flash_attn_func(q, k, v, alibi_slopes=torch.ones(4)), "alibi_slopes"),
    (lambda q, k, v: flash_attn_func(q, k, v, 0.1, return_attn_probs=True), "return_attn_probs"),
    (lambda q, k, v: flash_attn_with_kvcache(q, k, v, rotary_cos=torch.ones(8, 4)), "rotary_cos"),
    (lambda q, k, v: flash_attn_with_kvcache(q, k, v, cache_leftpad=torch.zeros(2, dtype=torch.int32)),
     "cache_leftpad"),
    (lambda q, k, v: flash_attn_varlen_func(q[0], k[0], v[0], *[cu_seqlens_from_lengths([5], DEVICE)] * 2, 5, 5,
                                            0.1), "dropout_p"),
])
def test_what_flashlab_lacks_raises_naming_the_argument(call, name):
    q, k, v = _randn(2, 5, 4, 16), _randn(2, 5, 2, 16), _randn(2, 5, 2, 16)
    with pytest.raises(NotImplementedError, match=f"^{name}="):
        call(q, k, v)


def test_ported_calls_compile_with_fullgraph():
    """The interface is flashlab's custom ops underneath: a function of FlashAttention calls compiles with
    fullgraph=True, forward and backward, and gives the eager results."""
    q, k, v = _randn(2, 5, 4, 16, requires_grad=True), _randn(2, 9, 2, 16), _randn(2, 9, 2, 16)
    lengths = [3, 6]
    cu = cu_seqlens_from_lengths(lengths, DEVICE)
    x = _randn(9, 4, 16)

    def step(q, k, v, x):
        dense = flash_attn_func(q, k, v, causal=True, window_size=(4, 0), softcap=3.0)
        packed = flash_attn_varlen_func(x, x, x, cu, cu, 6, 6, causal=True)
        return dense.square().sum() + packed.sum()

    want = step(q, k, v, x)
    want_grad, = torch.autograd.grad(want, q)
    torch._dynamo.reset()
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v, x)
    got_grad, = torch.autograd.grad(got, q)
    assert_close(got, want, tol=1e-6)
    assert_close(got_grad, want_grad, tol=1e-6)
