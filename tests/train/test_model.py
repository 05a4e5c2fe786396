"""The causal transformer's rotary position embeddings."""

import pytest
import torch

from flashlab.train.model import CausalTransformer, rotary, rotary_dims


def test_rotary_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 64, dtype=torch.float64), torch.randn(1, 1, 1, 64, dtype=torch.float64)
    n = 300
    rq = rotary(q.expand(1, 1, n, 64).contiguous().float()).double()   # the same q at every position
    rk = rotary(k.expand(1, 1, n, 64).contiguous().float()).double()
    scores = rq[0, 0] @ rk[0, 0].T                                      # (n, n)
    for offset in (0, 1, 17, 250):
        diagonal = torch.diagonal(scores, -offset)                         # q at i, k at i − offset
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), rtol=1e-4, atol=1e-4)
    assert torch.allclose(rotary(q.float())[0, 0, 0].double(), q[0, 0, 0], atol=1e-6)    # position 0: no rotation
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1).expand(1, 1, n), rtol=1e-5)     # a rotation keeps norms


def test_rotary_model_has_no_position_parameters_and_runs_longer_than_trained():
    torch.manual_seed(0)
    learned = CausalTransformer(32, 16, d_model=32, n_layers=1, n_heads=2, attention="sdpa")
    rope = CausalTransformer(32, 16, d_model=32, n_layers=1, n_heads=2, attention="sdpa", positions="rotary")
    assert learned.num_parameters() - rope.num_parameters() == 16 * 32
    tokens = torch.randint(0, 32, (2, 12))
    same = CausalTransformer(32, 16, d_model=32, n_layers=1, n_heads=2, attention="naive", positions="rotary")
    same.load_state_dict(rope.state_dict())
    torch.testing.assert_close(rope(tokens), same(tokens), rtol=1e-4, atol=1e-4)     # sdpa and naive agree
    assert rope(torch.randint(0, 32, (1, 40))).shape == (1, 40, 32)                  # past max_len = 16
    with pytest.raises(ValueError, match="max_len"):
        learned(torch.randint(0, 32, (1, 40)))
    with pytest.raises(ValueError, match="positions"):
        CausalTransformer(32, 16, positions="alibi")


def test_partial_rotary_leaves_the_other_dimensions_alone():
    torch.manual_seed(0)
    x = torch.randn(1, 1, 50, 64)
    partial = rotary(x, dims=16)
    assert torch.equal(partial[..., 16:], x[..., 16:])                  # content only: same at every position
    torch.testing.assert_close(partial[..., :16], rotary(x[..., :16]))  # the rest is ordinary rotary
    far_q, near_k = rotary(x[..., :1, :].expand(1, 1, 5000, 64), dims=16), partial
    assert torch.equal(far_q[0, 0, 4999, 16:], near_k[0, 0, 0, 16:])
    assert rotary_dims(64, 0.25) == 16 and rotary_dims(64, 1.0) == 64 and rotary_dims(8, 0.01) == 2
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="rotary_fraction"):
            CausalTransformer(32, 16, d_model=32, n_heads=2, positions="rotary", rotary_fraction=bad)
    with pytest.raises(ValueError, match="dims"):
        rotary(x, dims=15)
