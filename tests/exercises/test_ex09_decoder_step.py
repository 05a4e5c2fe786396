"""Tests for exercise 09 (the TSP decoder's masked glimpse and pointer), against a float64
reference, the package's `flashlab.train.tsp` functions, and the whole model decoding with yours."""

import math

import pytest
import torch
import torch.nn.functional as F

from flashlab import assert_close
from flashlab.train import tsp
from tests.exercises.hints import require


def _visited(batch, n):
    """Random visited sets with at least one unvisited city per instance."""
    visited = torch.rand(batch, n) < 0.5
    visited[torch.arange(batch), torch.randint(0, n, (batch,))] = False
    return visited


def _glimpse_float64(query, keys, values, visited):
    q, k, v = query.double(), keys.double(), values.double()
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores.masked_fill(visited[:, None, None, :], -torch.inf), dim=-1)
    return weights @ v


def _scale_hint(got, scores_unscaled, finish, d: int, n: int, what: str) -> str:
    """``"\\nhint: …"`` when ``got`` is ``finish(scores·c)`` for a usual wrong scale c (1/d, none, 1/√n),
    else ``""``: ``what``'s scores must be divided by √d, d the query's width."""
    wrong = {"1/d": 1 / d, "1 (no scale)": 1.0, f"1/√n, n = {n} cities": n ** -0.5}
    for name, c in wrong.items():
        if c != d ** -0.5 and torch.allclose(got.double(), finish(scores_unscaled * c), rtol=1e-4, atol=1e-6):
            return (f"\nhint: that is {what} with its scores multiplied by {name}. The scale is 1/√d with d = "
                    f"{d}, the last dimension of the vectors in the dot product, so that the scores have a spread "
                    f"of about 1 whatever d: here 1/√{d} = {d ** -0.5:.4g}")
    return ""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("batch,heads,n,d", [(1, 1, 1, 4), (3, 8, 7, 16), (5, 2, 50, 8)])
def test_glimpse_matches_float64_and_the_package(exercise, batch, heads, n, d, dtype):
    query = torch.randn(batch, heads, 1, d, dtype=dtype) * 2
    keys, values = (torch.randn(batch, heads, n, d, dtype=dtype) for _ in range(2))
    visited = _visited(batch, n)
    out = exercise.masked_glimpse(query, keys, values, visited)
    assert out.shape == (batch, heads, 1, d) and out.dtype == dtype
    try:
        assert_close(out, _glimpse_float64(query, keys, values, visited), dtype=dtype)
    except AssertionError as error:
        unscaled = query.double() @ keys.double().transpose(-1, -2)
        weights = lambda scores: torch.softmax(scores.masked_fill(visited[:, None, None, :], -torch.inf), -1)  # noqa: E731
        hint = _scale_hint(out, unscaled, lambda scores: weights(scores) @ values.double(), d, n, "the glimpse")
        raise AssertionError(f"{error}{hint}") from None
    package = tsp.masked_glimpse(query, keys, values, visited, F.scaled_dot_product_attention)
    assert_close(out, package.double(), dtype=dtype, what="against flashlab.train.tsp.masked_glimpse")


def test_glimpse_ignores_visited_cities(exercise):
    """Whatever the visited cities' keys and values hold, the glimpse is the same."""
    query = torch.randn(2, 4, 1, 8, dtype=torch.float64)
    keys, values = (torch.randn(2, 4, 12, 8, dtype=torch.float64) for _ in range(2))
    visited = _visited(2, 12)
    before = exercise.masked_glimpse(query, keys, values, visited)
    keys2, values2 = keys.clone(), values.clone()
    keys2[visited[:, None, :].expand(2, 4, 12)] = 50.0          # huge scores, if they were not masked
    values2[visited[:, None, :].expand(2, 4, 12)] = 1e6
    assert_close(exercise.masked_glimpse(query, keys2, values2, visited), before,
                 what="glimpse after changing visited cities")


def test_one_city_left_is_its_value(exercise):
    query = torch.randn(3, 2, 1, 8, dtype=torch.float64)
    keys, values = (torch.randn(3, 2, 6, 8, dtype=torch.float64) for _ in range(2))
    visited = torch.ones(3, 6, dtype=torch.bool)
    last = torch.tensor([0, 5, 2])
    visited[torch.arange(3), last] = False
    out = exercise.masked_glimpse(query, keys, values, visited)
    assert_close(out[:, :, 0], values[torch.arange(3), :, last], what="the only unvisited city's value")


def _pointer_float64(glimpse, logit_keys, visited, clip):
    u = (logit_keys.double() @ glimpse.double()[:, :, None])[..., 0] / math.sqrt(glimpse.shape[-1])
    return torch.log_softmax((clip * torch.tanh(u)).masked_fill(visited, -torch.inf), dim=-1)


def _visited_not_masked(log_p, glimpse, logit_keys, visited, clip) -> str:
    """The failure message for visited cities whose log p is not −inf, naming the mask put
    before the tanh when log p has its signature (visited logits C·tanh(−inf) = −C)."""
    message = (f"a visited city must get log p = −inf (probability 0); got {log_p[visited][:6].tolist()} "
               f"for the first visited ones")
    u = (logit_keys.double() @ glimpse.double()[:, :, None])[..., 0] / math.sqrt(glimpse.shape[-1])
    mask_first = torch.log_softmax(clip * torch.tanh(u.masked_fill(visited, -torch.inf)), dim=-1)
    if torch.allclose(log_p.double(), mask_first, rtol=1e-4, atol=1e-4):
        message += (f"\nhint: that is the mask put before the tanh: tanh(−inf) = −1, so a visited city gets the "
                    f"logit C·(−1) = −{clip}, finite, and a probability > 0. Mask after the tanh: "
                    f"(C · tanh(u)).masked_fill(visited, −inf)")
    return message


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("batch,n,dim,clip", [(1, 1, 8, 10.0), (4, 20, 32, 10.0), (3, 9, 16, 2.5)])
def test_pointer_matches_float64_and_the_package(exercise, batch, n, dim, clip, dtype):
    glimpse = torch.randn(batch, dim, dtype=dtype) * 4     # raw scores of several units: the clip matters
    logit_keys = torch.randn(batch, n, dim, dtype=dtype)
    visited = _visited(batch, n)
    log_p = exercise.pointer_log_probs(glimpse, logit_keys, visited, clip)
    assert log_p.shape == (batch, n) and log_p.dtype == torch.float32
    masked = bool(torch.isneginf(log_p[visited]).all())
    require(masked, _visited_not_masked(log_p, glimpse, logit_keys, visited, clip))
    assert_close(log_p.exp().double().sum(-1), torch.ones(batch, dtype=torch.float64), dtype=torch.float32,
                 what="probabilities summed over cities")
    want = _pointer_float64(glimpse, logit_keys, visited, clip)
    try:
        assert_close(log_p[~visited], want[~visited], dtype=torch.float32, what="log p of unvisited cities")
    except AssertionError as error:
        unscaled = (logit_keys.double() @ glimpse.double()[:, :, None])[..., 0]
        log_softmax = lambda u: torch.log_softmax((clip * torch.tanh(u)).masked_fill(visited, -torch.inf), -1)  # noqa: E731
        hint = _scale_hint(log_p[~visited], unscaled, lambda u: log_softmax(u)[~visited], dim, n, "the pointer")
        raise AssertionError(f"{error}{hint}") from None
    package = tsp.pointer_log_probs(glimpse, logit_keys, visited, clip)
    assert_close(log_p[~visited], package[~visited].double(), dtype=torch.float32,
                 what="against flashlab.train.tsp.pointer_log_probs")


def test_pointer_clips_with_tanh(exercise):
    """Any two unvisited cities' log-probabilities differ by at most 2C, however large the scores."""
    glimpse, logit_keys = torch.randn(2, 16) * 100, torch.randn(2, 10, 16)
    visited = torch.zeros(2, 10, dtype=torch.bool)
    log_p = exercise.pointer_log_probs(glimpse, logit_keys, visited, 3.0)
    spread = log_p.amax(-1) - log_p.amin(-1)
    clipped = bool((spread <= 6.0 + 1e-4).all())
    require(clipped, f"log-probabilities spread {spread.tolist()} > 2C = 6: clip with C·tanh")


def test_the_model_decodes_the_same_with_your_step(exercise, monkeypatch):
    """AttentionModel.forward calls flashlab.train.tsp.masked_glimpse and pointer_log_probs: with
    yours in their place, greedy tours and their log-probabilities are the package's."""
    torch.manual_seed(0)
    model = tsp.AttentionModel(embed_dim=16, n_heads=2, n_layers=1, ff_dim=32,
                               attention_fn=F.scaled_dot_product_attention).eval()
    coords = tsp.random_instances(3, 9, seed=5)
    with torch.no_grad():
        tours, log_p = model(coords)
        monkeypatch.setattr(tsp, "masked_glimpse", lambda q, k, v, visited, attention_fn: exercise.masked_glimpse(
            q, k, v, visited))
        monkeypatch.setattr(tsp, "pointer_log_probs", exercise.pointer_log_probs)
        my_tours, my_log_p = model(coords)
    assert my_tours.shape == tours.shape, f"tours of shape {tuple(my_tours.shape)}, want {tuple(tours.shape)}"
    differ = (my_tours != tours).nonzero()
    if len(differ):
        instance, step = min(differ.tolist(), key=lambda d: (d[1], d[0]))      # the earliest decoding step
        pytest.fail(f"with your step the model's greedy tours differ from the package's, first at step {step} of "
                    f"instance {instance}: yours went to city {my_tours[instance, step].item()}, the package's to "
                    f"{tours[instance, step].item()}. That instance's tours: yours {my_tours[instance].tolist()}, "
                    f"the package's {tours[instance].tolist()}. Look at the step's log-probabilities: a visited "
                    f"city must get −inf, and greedy takes the largest.", pytrace=False)
    assert_close(my_log_p, log_p, dtype=torch.float32, what="tour log-probabilities")
