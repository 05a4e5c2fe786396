"""flashlab.tiled_attention: forward and backward against float64, the saved-tensor
contract, the no-N×N bound, and the HBM traffic model."""

import pytest
import torch

from flashlab import assert_close, reference_attention, reference_gradients
from flashlab.lessons.instrument import LargestTensor, TrafficCounter
from flashlab.lessons.traffic import blocks_for_onchip_memory, tiled_forward_traffic
from flashlab.reference.tiled import tiled_attention, tiled_attention_backward, tiled_attention_forward

CASES = [(1, 1, 16), (17, 17, 16), (1000, 1000, 32), (100, 37, 16), (37, 100, 16), (65, 64, 8)]


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,D", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_forward_and_gradients_match_float64(Nq, Nk, D, is_causal, dtype):
    q = torch.randn(2, 2, Nq, D, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, 2, Nk, D, dtype=dtype, requires_grad=True) for _ in range(2))
    out = tiled_attention(q, k, v, is_causal=is_causal, block_m=32, block_n=16)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    assert_close(out, reference_attention(q, k, v, is_causal=is_causal), dtype=dtype)
    refs = reference_gradients(q, k, v, grad_out, is_causal=is_causal)
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), refs):
        assert got.dtype == dtype
        assert_close(got, want, dtype=dtype, what=f"d{name}")


def test_gradcheck_float64():
    q, k, v = (torch.randn(1, 2, 7, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    for causal in (False, True):
        def fn(a, b, c, causal=causal):
            return tiled_attention(a, b, c, is_causal=causal, block_m=3, block_n=2)
        assert torch.autograd.gradcheck(fn, (q, k, v))


def test_saves_only_inputs_output_and_logsumexp():
    q, k, v = (torch.randn(2, 3, 40, 8, requires_grad=True) for _ in range(3))
    out = tiled_attention(q, k, v, block_m=16, block_n=16)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 5
    assert [tuple(t.shape) for t in saved] == [(2, 3, 40, 8)] * 4 + [(2, 3, 40)]
    assert saved[0] is q or torch.equal(saved[0], q)
    assert torch.equal(saved[3], out.detach())


@pytest.mark.parametrize("block", [16, 32])
def test_largest_intermediate_is_bounded_by_the_blocks(block):
    B, H, N, D = 1, 2, 512, 16
    q, k, v = (torch.randn(B, H, N, D, requires_grad=True) for _ in range(3))
    with LargestTensor() as largest:
        tiled_attention(q, k, v, block_m=block, block_n=block).sum().backward()
    assert largest.numel <= max(B * H * N * D, B * H * block * block)
    assert largest.numel < B * H * N * N // 16


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("N,block_m,block_n", [(256, 64, 64), (1000, 48, 80), (17, 4, 8)])
def test_counted_traffic_equals_the_model(N, block_m, block_n, is_causal):
    q, k, v = (torch.randn(1, 2, N, 16, dtype=torch.float16) for _ in range(3))
    counter = TrafficCounter()
    tiled_attention_forward(q, k, v, is_causal, None, block_m, block_n, observer=counter)
    model = tiled_forward_traffic(1, 2, N, 16, torch.float16, block_m=block_m, block_n=block_n,
                                  is_causal=is_causal)
    assert counter.total == sum(model.values())
    assert counter.bytes_read["K"] + counter.bytes_read["V"] == model["read K, V"]


def test_traffic_scales_like_n2_d2_over_m():
    d = 64
    def traffic(n, m_bytes):
        bm, bn = blocks_for_onchip_memory(m_bytes, d)
        return sum(tiled_forward_traffic(1, 1, n, d, block_m=bm, block_n=bn).values())
    # doubling N (at large N) ~quadruples traffic; doubling M halves the K/V re-reads
    assert 3.5 < traffic(16384, 2 ** 17) / traffic(8192, 2 ** 17) < 4.1
    small_blocks = blocks_for_onchip_memory(2 ** 14, 16)
    assert small_blocks[0] <= 16 and small_blocks[1] == 2 ** 14 // 2 // 64


def test_backward_bad_blocks():
    q = torch.randn(1, 1, 4, 4)
    with pytest.raises(ValueError, match="^block_m:"):
        tiled_attention(q, q, q, block_m=0)
    with pytest.raises(ValueError, match="^block_n:"):
        tiled_attention_backward(q, q, q, q, q[..., 0], q, block_n=-1)
