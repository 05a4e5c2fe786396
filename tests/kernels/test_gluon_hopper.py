"""The Gluon forward (flashlab.kernels.gluon_hopper, flashlab.launch.gluon): which calls it takes,
and on an sm_90 GPU every variant (plain warp specialisation, intra-warpgroup overlap, ping-pong)
against float64, GQA and causal included, then through flashlab.attention with FLASHLAB_GLUON=1."""

import math
from types import SimpleNamespace

import pytest
import torch

from flashlab import attention
from flashlab.launch import gluon
from flashlab.launch.spec import AttentionSpec
from flashlab.reference.float64 import TOLERANCE, reference_attention, rel_error

hopper_gpu = pytest.mark.gpu(capability=9)          # TMA, wgmma and mbarriers: sm_90 only
VARIANTS = {"plain": dict(overlap=False, pingpong=False), "overlap": dict(overlap=True, pingpong=False),
            "pingpong": dict(overlap=True, pingpong=True)}


def fake(shape=(2, 4, 256, 64), dtype=torch.bfloat16, device="cuda", contiguous=True):
    """A tensor's outside as why_not_gluon reads it: no GPU needed to test the decision."""
    return SimpleNamespace(shape=torch.Size(shape), dtype=dtype, device=torch.device(device),
                           data_ptr=lambda: 4096, is_contiguous=lambda: contiguous)


@pytest.fixture
def gluon_machine(monkeypatch):
    """Pretend to be an sm_90 GPU with Triton 3.6 and FLASHLAB_GLUON=1."""
    monkeypatch.setenv("FLASHLAB_GLUON", "1")
    monkeypatch.setattr(gluon, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(gluon, "_triton_version", lambda: (3, 6))


def test_the_common_case_takes_the_gluon_forward(gluon_machine):
    q = fake()
    assert gluon.why_not_gluon(q, q, q, None, AttentionSpec(0.125, True)) is None


@pytest.mark.parametrize("change, reason", [
    (dict(shape=(2, 4, 200, 64)), "multiple of 128"),
    (dict(shape=(2, 4, 256, 96)), "head dimension 96"),
    (dict(dtype=torch.float32), "fp16/bf16"),
    (dict(device="cpu"), "sm_90"),
    (dict(contiguous=False), "contiguous"),
])
def test_what_the_gluon_forward_does_not_take_is_named(gluon_machine, change, reason):
    q = fake(**change)
    assert reason in gluon.why_not_gluon(q, q, q, None, AttentionSpec(0.125, False))


def test_masks_windows_and_softcap_stay_on_the_triton_kernels(gluon_machine):
    q = fake()
    assert "soft-cap" in gluon.why_not_gluon(q, q, q, None, AttentionSpec(0.125, False, softcap=30.0))
    assert "attn_mask" in gluon.why_not_gluon(q, q, q, object(), AttentionSpec(0.125, False))


def test_off_unless_switched_on(monkeypatch):
    monkeypatch.delenv("FLASHLAB_GLUON", raising=False)
    monkeypatch.setattr(gluon, "_capability", lambda device: (9, 0))
    q = fake()
    expected = None if gluon.ON_BY_DEFAULT else "FLASHLAB_GLUON"
    reason = gluon.why_not_gluon(q, q, q, None, AttentionSpec(0.125, False))
    assert reason is None if expected is None else expected in reason
    monkeypatch.setenv("FLASHLAB_GLUON", "0")
    assert "FLASHLAB_GLUON" in gluon.why_not_gluon(q, q, q, None, AttentionSpec(0.125, False))


def float64_lse(q, k, causal, scale):
    """log2 of the softmax denominator per query, the kernel's L, in float64."""
    scores = q.double() @ k.double().transpose(-1, -2) * scale
    if causal:
        n = q.shape[2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.logsumexp(scores, -1) / math.log(2)


@hopper_gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, heads, kv_heads", [(128, 2, 2), (640, 4, 2), (1024, 8, 1)])
def test_each_variant_against_float64(variant, dtype, d, causal, n, heads, kv_heads):
    torch.manual_seed(n + d)
    q = torch.randn(2, heads, n, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(2, kv_heads, n, d, device="cuda", dtype=dtype) for _ in range(2))
    out, lse = gluon.forward(q, k, v, AttentionSpec(d ** -0.5, causal), **VARIANTS[variant])
    k_full, v_full = (t.repeat_interleave(heads // kv_heads, 1) for t in (k, v))
    assert rel_error(out, reference_attention(q, k_full, v_full, is_causal=causal)) <= TOLERANCE[dtype]
    assert float((lse.double() - float64_lse(q, k_full, causal, d ** -0.5)).abs().max()) < 1e-3


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_flashlab_attention_dispatches_it_and_its_gradients_hold(monkeypatch, causal):
    """FLASHLAB_GLUON=1: the forward is the Gluon kernel's, the backward the Hopper kernels', reading
    the Gluon forward's log-sum-exp."""
    monkeypatch.setenv("FLASHLAB_GLUON", "1")
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 4, 512, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    assert gluon.why_not_gluon(q, k, v, None, AttentionSpec(128 ** -0.5, causal)) is None
    out = attention(q, k, v, is_causal=causal)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference_attention(q64, k64, v64, is_causal=causal)
    ref.backward(grad_out.double())
    assert rel_error(out, ref) <= TOLERANCE[torch.bfloat16]
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert rel_error(got, want) <= TOLERANCE[torch.bfloat16]
