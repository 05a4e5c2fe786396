"""flashlab.naive_attention against PyTorch's SDPA and the float64 reference."""

import pytest
import torch
import torch.nn.functional as F

from flashlab import (
    TOLERANCE,
    assert_close,
    naive_attention,
    reference_attention,
    reference_gradients,
    rel_error,
)

SHAPES = [(1, 1, 1, 1, 16), (2, 3, 17, 17, 16), (1, 2, 17, 40, 32), (2, 1, 100, 9, 8),
          (1, 1, 1000, 1000, 16)]


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("B,H,Nq,Nk,D", SHAPES)
def test_matches_sdpa_fp32(B, H, Nq, Nk, D, is_causal):
    q, k, v = torch.randn(B, H, Nq, D), torch.randn(B, H, Nk, D), torch.randn(B, H, Nk, D)
    out = naive_attention(q, k, v, is_causal=is_causal)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    # both are fp32 with fp32 accumulation: agreement to ~1e-7, stated bound 1e-5
    assert rel_error(out, expected) <= TOLERANCE[torch.float32]
    assert_close(out, reference_attention(q, k, v, is_causal=is_causal))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_against_float64(dtype):
    q, k, v = (torch.randn(2, 2, 33, 16, dtype=dtype) for _ in range(3))
    assert_close(naive_attention(q, k, v, is_causal=True),
                 reference_attention(q, k, v, is_causal=True), dtype=dtype)


@pytest.mark.parametrize("mask_shape", [(2, 3, 17, 23), (2, 1, 1, 23), (17, 23)])
def test_boolean_and_float_masks_match_sdpa(mask_shape):
    q, k, v = torch.randn(2, 3, 17, 8), torch.randn(2, 3, 23, 8), torch.randn(2, 3, 23, 8)
    keep = torch.rand(mask_shape) > 0.3
    keep[..., 0] = True  # every row keeps a key: SDPA's NaN behaviour is not compared here
    bias = torch.randn(mask_shape)
    for mask in (keep, bias):
        assert rel_error(naive_attention(q, k, v, mask),
                         F.scaled_dot_product_attention(q, k, v, attn_mask=mask)) <= 1e-5


def test_fully_masked_rows_give_zero_output_and_gradient():
    q, k, v = (torch.randn(1, 2, 6, 8, requires_grad=True) for _ in range(3))
    keep = torch.rand(1, 2, 6, 6) > 0.5
    keep[..., 2, :] = False          # query 2 sees nothing
    keep[..., 0, 0] = True
    out = naive_attention(q, k, v, keep)
    assert torch.isfinite(out).all() and torch.all(out[..., 2, :] == 0)
    out.backward(torch.randn_like(out))
    assert torch.isfinite(q.grad).all() and torch.all(q.grad[..., 2, :] == 0)
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradients_match_float64(is_causal):
    q = torch.randn(2, 2, 17, 16, requires_grad=True)
    k, v = (torch.randn(2, 2, 29, 16, requires_grad=True) for _ in range(2))
    out = naive_attention(q, k, v, is_causal=is_causal, scale=0.2)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref = reference_gradients(q, k, v, grad_out, is_causal=is_causal, scale=0.2)
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), ref):
        assert_close(got, want, what=f"d{name}")


def test_gradcheck_float64():
    q, k, v = (torch.randn(1, 1, 5, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: naive_attention(a, b, c, is_causal=True),
                                   (q, k, v))


def _qkv(**over):
    t = {"q": torch.randn(2, 3, 8, 16), "k": torch.randn(2, 3, 10, 16), "v": torch.randn(2, 3, 10, 16)}
    t.update(over)
    return t


@pytest.mark.parametrize("inputs,argument", [
    (_qkv(k=torch.randn(2, 3, 10, 8)), "k"),                    # head dims differ
    (_qkv(v=torch.randn(2, 3, 11, 16)), "v"),                   # Nk differs
    (_qkv(k=torch.randn(2, 4, 10, 16)), "k"),                   # heads differ
    (_qkv(q=torch.randn(16)), "q"),                             # rank 1
    (_qkv(k=torch.randn(3, 10, 16)), "k"),                      # rank differs
    (_qkv(v=torch.randn(2, 3, 10, 16, dtype=torch.float64)), "v"),  # dtype differs
    (_qkv(q=torch.randint(0, 3, (2, 3, 8, 16))), "q"),          # integer dtype
    (_qkv(q=torch.randn(2, 3, 0, 16)), "q"),                    # empty
    (_qkv(k=torch.randn(2, 3, 10, 16, device="meta")), "k"),    # device differs
])
def test_bad_inputs_name_the_argument(inputs, argument):
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        naive_attention(**inputs)


@pytest.mark.parametrize("kwargs,argument", [
    ({"attn_mask": torch.ones(5, 10, dtype=torch.bool)}, "attn_mask"),     # no broadcast
    ({"attn_mask": torch.ones(8, 10, dtype=torch.int32)}, "attn_mask"),    # wrong dtype
    ({"attn_mask": torch.ones(8, 10, dtype=torch.bool), "is_causal": True}, "attn_mask"),
    ({"scale": -1.0}, "scale"),
])
def test_bad_options_name_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        naive_attention(**_qkv(), **kwargs)
