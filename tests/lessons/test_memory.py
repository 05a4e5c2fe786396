"""The naive-attention memory model against measured allocations (CPU here; the same
test checks CUDA's peak allocated bytes on a GPU)."""

import pytest
import torch

from flashlab import largest_seq_len, measure_peak_memory, naive_attention, predict_naive_attention_memory

# The model follows PyTorch's CPU kernels op by op. On CUDA (H200, PyTorch 2.11) the
# forward peaks matched to the byte but the backward held one more N×N temporary and a
# first-use cuBLAS workspace, so the exactness tests run on the CPU everywhere.
DEVICE = "cpu"
# (B, H, Nq, Nk, D): square, Nq > Nk, Nq < Nk, and N = 1
SHAPES = [(1, 2, 256, 256, 32), (2, 3, 200, 96, 16), (1, 1, 64, 192, 64), (2, 2, 1, 1, 8)]


def _inputs(B, H, Nq, Nk, D, grad):
    make = lambda n: torch.randn(B, H, n, D, device=DEVICE, requires_grad=grad)  # noqa: E731
    return make(Nq), make(Nk), make(Nk)


@pytest.mark.parametrize("B,H,Nq,Nk,D", SHAPES)
def test_inference_and_forward_peaks_are_exact(B, H, Nq, Nk, D):
    model = predict_naive_attention_memory(B, H, Nq, D, torch.float32, kv_seq_len=Nk)
    q, k, v = _inputs(B, H, Nq, Nk, D, grad=False)
    assert measure_peak_memory(lambda: naive_attention(q, k, v), DEVICE).peak_bytes == model.inference_peak
    q, k, v = _inputs(B, H, Nq, Nk, D, grad=True)
    measured = measure_peak_memory(lambda: naive_attention(q, k, v), DEVICE).peak_bytes
    # the only unmodelled allocation is the 4-byte scale scalar autograd keeps
    assert model.forward_peak <= measured <= model.forward_peak + 64


@pytest.mark.parametrize("B,H,Nq,Nk,D", SHAPES[:3])  # the model's N×N-dominated regime
def test_training_peak_matches_model(B, H, Nq, Nk, D):
    model = predict_naive_attention_memory(B, H, Nq, D, torch.float32, kv_seq_len=Nk)
    q, k, v = _inputs(B, H, Nq, Nk, D, grad=True)
    grad_out = torch.randn(B, H, Nq, D, device=DEVICE)
    measured = measure_peak_memory(lambda: naive_attention(q, k, v).backward(grad_out), DEVICE).peak_bytes
    assert abs(measured - model.training_peak) <= 0.02 * model.training_peak + 64


def test_measure_sees_a_known_allocation():
    n = 1 << 20
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        measured = measure_peak_memory(lambda device=device: torch.empty(n, dtype=torch.float32, device=device),
                                       device)
        assert measured.peak_bytes == 4 * n
        assert device.upper() in measured.method


def test_model_scales_quadratically_and_by_dtype():
    small = predict_naive_attention_memory(2, 4, 1024, 64, torch.float16)
    large = predict_naive_attention_memory(2, 4, 2048, 64, torch.float16)
    assert large.scores == 4 * small.scores
    assert predict_naive_attention_memory(2, 4, 1024, 64, torch.float32).scores == 2 * small.scores
    assert small.scores == 2 * 4 * 1024 * 1024 * 2


def test_largest_seq_len_is_the_boundary():
    capacity = 16e9
    n = largest_seq_len(capacity, batch=1, heads=32, head_dim=128, dtype=torch.bfloat16)

    def needed(n):
        m = predict_naive_attention_memory(1, 32, n, 128, torch.bfloat16)
        return 6 * m.scaled_queries + m.training_peak

    assert needed(n) <= capacity < needed(n + 1)
    assert largest_seq_len(4 * capacity, 1, 32, 128, torch.bfloat16) > 1.9 * n


@pytest.mark.parametrize("argument", ["batch", "heads", "seq_len", "head_dim"])
def test_model_rejects_bad_sizes(argument):
    sizes = {"batch": 1, "heads": 1, "seq_len": 8, "head_dim": 8, argument: 0}
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        predict_naive_attention_memory(**sizes)
