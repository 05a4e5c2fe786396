"""TSP instances, heuristics, the Attention Model and eval-tsp (capstone, notebook 09)."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flashlab.cli import main
from flashlab.train.tsp import (
    AttentionModel,
    farthest_insertion,
    load_tours,
    nearest_neighbour,
    random_instances,
    save_model,
    save_tours,
    tour_length,
)


def test_tour_length_of_a_square_and_invalid_tours():
    square = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]])
    assert tour_length(square, torch.tensor([[0, 1, 2, 3]])).item() == pytest.approx(4.0)
    assert tour_length(square, torch.tensor([[0, 2, 1, 3]])).item() == pytest.approx(2 + 2 * 2**0.5)
    with pytest.raises(ValueError, match="^tours:"):
        tour_length(square, torch.tensor([[0, 1, 1, 3]]))


@pytest.mark.parametrize("heuristic", [nearest_neighbour, farthest_insertion])
def test_heuristics_give_valid_tours_no_shorter_than_optimal(heuristic):
    coords = random_instances(20, 7, seed=3)
    lengths = tour_length(coords, heuristic(coords))           # also checks they are permutations
    for i in range(20):                                         # brute-force optimum over 6! tours
        best = min(tour_length(coords[i:i + 1], torch.tensor([[0, *p]])).item()
                   for p in itertools.permutations(range(1, 7)))
        assert lengths[i].item() >= best - 1e-6


def test_heuristics_match_published_averages():
    """Kool et al. 2019, Table 1, TSP20: nearest neighbour 4.50, farthest insertion 3.93."""
    coords = random_instances(2000, 20, seed=0)
    assert tour_length(coords, nearest_neighbour(coords)).mean().item() == pytest.approx(4.50, abs=0.05)
    assert tour_length(coords, farthest_insertion(coords)).mean().item() == pytest.approx(3.93, abs=0.05)


def test_model_builds_valid_tours_and_is_small():
    torch.manual_seed(0)
    model = AttentionModel(attention_fn=F.scaled_dot_product_attention)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    coords = random_instances(6, 12, seed=1)
    for decode in ("greedy", "sample"):
        tours, log_p = model(coords, decode)
        tour_length(coords, tours)                             # raises unless each row is a permutation
        assert log_p.shape == (6,) and (log_p <= 0).all()
    model.eval()
    assert torch.equal(model(coords)[0], model(coords)[0])     # greedy is deterministic


def test_flashlab_attention_gives_the_same_model():
    """The encoder and the masked glimpse through flashlab's kernels (interpreter on CPU)
    give the same tours and log-probabilities as SDPA."""
    torch.manual_seed(0)
    ours = AttentionModel(embed_dim=32, n_heads=2, n_layers=1, ff_dim=64).eval()
    theirs = AttentionModel(embed_dim=32, n_heads=2, n_layers=1, ff_dim=64,
                            attention_fn=F.scaled_dot_product_attention).eval()
    theirs.load_state_dict(ours.state_dict())
    coords = random_instances(2, 6, seed=2)
    (t1, p1), (t2, p2) = ours(coords), theirs(coords)
    assert torch.equal(t1, t2) and torch.allclose(p1, p2, atol=1e-4)


def test_eval_tsp_command_line(tmp_path, capsys):
    torch.manual_seed(0)
    model = AttentionModel(embed_dim=32, n_heads=2, n_layers=1, ff_dim=64, attention_fn=F.scaled_dot_product_attention)
    save_model(model, tmp_path / "am.pt", note="untrained")
    out = tmp_path / "tours.npz"
    assert main(["eval-tsp", "--checkpoint", str(tmp_path / "am.pt"), "--nodes", "20", "--instances", "16",
                 "--seed", "5", "--save-tours", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gap to the published optimum 3.84" in printed and "farthest insertion" in printed
    with np.load(out) as raw:                       # the seed, not the cities: see save_tours
        assert set(raw.files) == {"seed", "tours", "lengths"} and raw["tours"].dtype == np.uint8
    saved = load_tours(out)
    coords, tours = torch.from_numpy(saved["coords"]), torch.from_numpy(saved["tours"])
    assert saved["seed"] == 5 and torch.equal(coords, random_instances(16, 20, seed=5))
    np.testing.assert_allclose(tour_length(coords, tours).numpy(), saved["lengths"], rtol=1e-6)
    assert f"{saved['lengths'].mean():.4f}" in printed


def test_load_tours_refuses_lengths_that_are_not_the_tours_of_the_seed(tmp_path):
    coords = random_instances(8, 12, seed=3)
    tours = farthest_insertion(coords)
    path = tmp_path / "tours.npz"
    save_tours(path, 3, tours, tour_length(coords, tours))
    assert torch.equal(torch.from_numpy(load_tours(path)["tours"]), tours)
    save_tours(tmp_path / "tours", 2**64 - 1, tours, tour_length(coords, tours))    # the name given, any seed
    assert (tmp_path / "tours").exists() and not (tmp_path / "tours.npz.npz").exists()
    save_tours(path, 4, tours, tour_length(coords, tours))          # the cities of another seed
    with pytest.raises(ValueError, match="not those of its tours over the cities of seed 4"):
        load_tours(path)
    np.savez_compressed(path, coords=coords.numpy(), tours=tours.numpy(),      # the format before the seed
                        lengths=tour_length(coords, tours).numpy())
    old = load_tours(path)
    assert old["seed"] is None and np.array_equal(old["coords"], coords.numpy())


def test_encoder_benchmark_times_every_attention():
    from flashlab.bench.encoder import benchmark_encoder

    rows = benchmark_encoder([10], batch=2, warmup_ms=1, rep_ms=1)
    assert [r["attention"] for r in rows] == ["naive", "sdpa", "flashlab"]
    assert all("error" not in r and r["fwd_ms"] > 0 and r["fwd+bwd_ms"] > 0 for r in rows)


def test_plot_tour_draws_the_closed_tour():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flashlab.train.tsp import plot_tour
    coords = random_instances(1, 5, seed=0)[0]
    tour = torch.tensor([2, 0, 4, 1, 3])
    ax = plt.subplots()[1]
    plot_tour(ax, coords, tour)
    xs, ys = ax.lines[0].get_data()
    assert len(xs) == 6 and (xs[0], ys[0]) == (xs[-1], ys[-1]) == tuple(coords[2].tolist())
