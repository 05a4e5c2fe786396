"""TF32 products round their fp32 operands to nearest (`flashlab.kernels.tile.dot`), as cuBLAS does when
torch allows TF32, instead of the truncation Hopper's tensor cores apply to raw fp32 bits. On the
CPU Triton's interpreter multiplies exactly, so the rounding the kernels add is all there is to
see: the results must match a float64 emulation of round-to-nearest TF32 and not the exact or
the truncated product. (Without this rounding, flashlab's TF32 output on a Hopper GPU was as far from
float64 as a float64 emulation of truncation, about 3.5 times PyTorch TF32's error.)"""

import flashlab  # noqa: F401, I001  (first: the interpreter on a CPU-only machine)
import pytest
import torch
import triton
import triton.language as tl

from flashlab.kernels.tile import round_to_tf32
from flashlab.launch import dispatch
from flashlab.launch.runtime import kernel_for
from flashlab.launch.spec import AttentionSpec
from flashlab.reference.float64 import rel_error, tf32_nearest, tf32_truncated


@triton.jit
def _round_probe(X, OUT, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(OUT + offs, round_to_tf32(tl.load(X + offs, mask=offs < n)), mask=offs < n)


def test_rounding_matches_round_to_nearest_even_on_edge_values():
    ulp = 2.0 ** -10                      # TF32's spacing at 1.0
    values = torch.tensor([
        0.0, -0.0, 1.0, -1.0, 1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2 ** -20, -(1 + ulp / 2 + 2 ** -20),
        1 + ulp / 4, 3.0e38, 3.4028235e38, -3.4028235e38, 1e-40, -1e-40, 1.17549435e-38,
        float("inf"), float("-inf"), float("nan"), 0.1, -2.7182817, 65504.0, 1e-8], dtype=torch.float32)
    values = torch.cat([values, torch.randn(1000) * torch.logspace(-20, 20, 1000)])
    out = torch.empty_like(values)
    kernel_for(_round_probe, values.device)[(1,)](values, out, values.numel(), BLOCK=2048)
    want = tf32_nearest(values)
    same = (out.view(torch.int32) == want.view(torch.int32)) | (out.isnan() & want.isnan())
    assert bool(same.all()), values[~same]
    assert out[4] == 1.0 and out[5] == 1 + 2 * ulp, "ties go to even"
    assert out[6] == 1 + ulp and out[7] == -(1 + ulp), "past the tie: away from zero"
    assert out[10] == float("inf") and out[11] == float("-inf"), "the largest float rounds up to Inf"
    assert torch.isinf(out[15]) and out[16] == float("-inf") and out[17].isnan()


def _emulated(q, k, v, rounding):
    """softmax(Q Kᵀ·scale) V with the two products on ``rounding``'s operands, the rest in float64."""
    scale = q.shape[-1] ** -0.5
    s = rounding(q).double() @ rounding(k).double().transpose(-1, -2) * scale
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (rounding(p.float()).double() @ rounding(v).double()) / p.sum(-1, keepdim=True)


@pytest.mark.parametrize("n, d", [(1, 16), (70, 64), (130, 96)])
def test_tf32_forward_rounds_its_operands_to_nearest(n, d):
    torch.manual_seed(n)
    q, k, v = (torch.randn(1, 2, n, d) for _ in range(3))
    out, _ = dispatch.forward(q, k, v, None, AttentionSpec(d ** -0.5, precision="tf32"))
    exact = _emulated(q, k, v, lambda x: x)
    nearest, truncated = _emulated(q, k, v, tf32_nearest), _emulated(q, k, v, tf32_truncated)
    err_nearest = rel_error(out, nearest)
    # the kernel rounds P relative to the running maximum (online softmax), the emulation relative
    # to the final one, so elements of P round differently: 1e-4 apart, not 1e-7; truncation and
    # exact products are 4e-4 to 1.5e-3 away
    assert err_nearest < 2.5e-4, err_nearest
    if n > 1:                             # one key: P = 1 and O = V rounded or not alike
        assert rel_error(out, exact) > 2e-4, "the operands were rounded"
        assert rel_error(out, truncated) > 4 * err_nearest, "to nearest, not toward zero"


def test_tf32_backward_matches_the_exact_one_to_tf32_accuracy():
    torch.manual_seed(0)
    q, k, v, grad = (torch.randn(1, 2, 90, 64) for _ in range(4))
    scale = 64 ** -0.5
    grads = {}
    for precision in ("ieee", "tf32"):
        spec = AttentionSpec(scale, is_causal=True, precision=precision)
        out, lse = dispatch.forward(q, k, v, None, spec)
        grads[precision] = dispatch.backward(q, k, v, out, lse, grad, None, spec)
    for name, exact, tf32 in zip(("dq", "dk", "dv"), grads["ieee"], grads["tf32"]):
        err = rel_error(tf32, exact)
        assert 1e-5 < err < 3e-3, (name, err)          # rounded (not exact), and to TF32's accuracy
