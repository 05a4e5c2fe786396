"""flashlab.lessons.tiled_kernels: the notebooks' direct call of the tiled kernels, at sizes where
`flashlab.attention` would take the small path."""

import pytest
import torch

from flashlab import assert_close, reference_attention, reference_gradients
from flashlab.launch import small
from flashlab.lessons.tiled_kernels import tiled_kernel_attention


@pytest.mark.parametrize("n, options", [(1, {}), (37, {"is_causal": True}),
                                        (20, {"attn_mask": "bool", "softcap": 1.0}), (70, {"window": (9, 0)})])
def test_the_tiled_kernels_match_float64_where_the_small_path_would_run(monkeypatch, n, options):
    def refuse(*args, **kwargs):
        raise AssertionError("the small path ran")
    monkeypatch.setattr(small, "forward", refuse)
    monkeypatch.setattr(small, "backward", refuse)
    options = dict(options)
    if options.get("attn_mask") == "bool":
        options["attn_mask"] = torch.rand(1, 1, 1, n) > 0.3
    q, k, v = (torch.randn(1, 2, n, 16, requires_grad=True) for _ in range(3))
    out = tiled_kernel_attention(q, k, v, **options)
    grad = torch.randn_like(out)
    out.backward(grad)
    assert_close(out, reference_attention(q, k, v, **options))
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), reference_gradients(q, k, v, grad, **options)):
        assert_close(got, want, what=f"d{name}")


def test_bad_arguments_are_named():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="^softcap:"):
        tiled_kernel_attention(q, q, q, softcap=-1.0)
    with pytest.raises(ValueError, match="^window:"):
        tiled_kernel_attention(q, q, q, window=(1,))
