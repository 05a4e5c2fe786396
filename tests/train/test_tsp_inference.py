"""Inference that spends compute for quality (flashlab.train.tsp): multi-start greedy, ×8
augmentation, sampling with a budget, and eval-tsp's options for them. SDPA runs the attention
(the interpreted kernels would take minutes here)."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flashlab.cli import main
from flashlab.train.tsp import (
    AttentionModel,
    augmented_greedy,
    best_tours,
    check_inference_options,
    describe_inference,
    load_model,
    load_tours,
    multi_start_greedy,
    random_instances,
    rollouts,
    sampled_best,
    save_model,
    shortest_tours,
    symmetric_views,
    tour_length,
)

CHECKPOINT = str(Path(__file__).resolve().parents[2] / "checkpoints" / "am_tsp20.pt")


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return AttentionModel(embed_dim=16, n_heads=2, n_layers=1, ff_dim=32,
                          attention_fn=F.scaled_dot_product_attention).eval()


def test_the_8_views_are_the_squares_symmetries_and_keep_every_tour_length():
    coords = random_instances(5, 9, seed=11).double()
    views = symmetric_views(coords)
    assert views.shape == (5, 8, 9, 2) and torch.equal(views[:, 0], coords)
    assert ((views >= 0) & (views <= 1)).all()
    corner = views[0, :, 0]                              # one city's 8 images: all different (no view twice)
    assert len({tuple(p.tolist()) for p in corner}) == 8
    tours = torch.stack([torch.randperm(9, generator=torch.Generator().manual_seed(i)) for i in range(5)])
    lengths = torch.stack([tour_length(views[:, v], tours) for v in range(8)], 1)
    torch.testing.assert_close(lengths, lengths[:, :1].expand(-1, 8), rtol=1e-12, atol=0)   # float64 rounding


def test_a_forced_first_city_starts_the_tour_with_the_context_first_first(tiny, monkeypatch):
    coords = random_instances(4, 7, seed=2)
    first = torch.tensor([3, 0, 6, 3])
    contexts = []
    real = tiny.project_step.forward
    monkeypatch.setattr(tiny.project_step, "forward", lambda x: contexts.append(x) or real(x))
    with torch.no_grad():
        nodes = tiny.encode(coords)
        tours, log_p = tiny.decode(tiny.precompute(nodes), first_city=first)
    tour_length(coords, tours)                           # raises unless each row is a permutation
    assert torch.equal(tours[:, 0], first) and len(contexts) == 6    # n − 1 decoded steps
    rows = torch.arange(4)
    assert torch.equal(contexts[0], torch.cat([nodes[rows, first], nodes[rows, first]], -1))
    assert torch.equal(contexts[1], torch.cat([nodes[rows, first], nodes[rows, tours[:, 1]]], -1))
    assert (log_p <= 0).all() and log_p.shape == (4,)


def test_rollouts_are_one_call_per_view_and_start(tiny):
    """The batched rollouts, rollout r = view · starts + start, against one model call per start
    city on all the views (this catches a repeat where repeat_interleave belongs)."""
    coords = random_instances(3, 7, seed=5)
    tours = rollouts(tiny, coords, augment=8, starts=7)
    assert tours.shape == (3, 56, 7)
    views = symmetric_views(coords).flatten(0, 1)                   # (3 · 8, 7, 2)
    cache = tiny.precompute(tiny.encode(views))
    for start in range(7):
        one, _ = tiny.decode(cache, first_city=torch.full((24,), start))
        assert torch.equal(tours[:, start::7], one.view(3, 8, 7)), start
    every, _ = tiny(coords, multi_start=True)                      # the training step's multi-start
    assert torch.equal(every.view(3, 7, 7), tours[:, :7])
    own, _ = tiny(coords)
    assert torch.equal(rollouts(tiny, coords)[:, 0], own)          # augment 1, no starts: plain greedy
    sampled = rollouts(tiny, coords, starts=3, samples=2, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (3, 6, 7) and torch.equal(sampled[0, :, 0], torch.tensor([0, 0, 1, 1, 2, 2]))


def test_best_tours_keeps_the_shortest_in_any_chunking(tiny):
    coords = random_instances(5, 8, seed=7)
    all_tours = rollouts(tiny, coords, augment=8, starts=8)
    lengths = tour_length(coords.repeat_interleave(64, 0), all_tours.flatten(0, 1)).view(5, 64)
    best, best_lengths = shortest_tours(coords, all_tours)
    torch.testing.assert_close(best_lengths, lengths.min(1).values)
    torch.testing.assert_close(tour_length(coords, best), best_lengths)
    for max_rollouts in (1, 100, 10_000):                # one instance per chunk, two, all at once
        tours, chunked = multi_start_greedy(tiny, coords, augment=8, max_rollouts=max_rollouts)
        torch.testing.assert_close(chunked, best_lengths)
        torch.testing.assert_close(tour_length(coords, tours), chunked)
    greedy = tour_length(coords, tiny(coords)[0])
    assert torch.equal(best_tours(tiny, coords)[1], greedy)         # augment 1: plain greedy
    assert (augmented_greedy(tiny, coords)[1] <= greedy).all()      # the identity is one of the 8 views


def test_sampling_is_reproducible_and_keeps_the_best_of_its_samples(tiny):
    coords = random_instances(6, 9, seed=3)
    tours, lengths = sampled_best(tiny, coords, samples=16, seed=4)
    again = sampled_best(tiny, coords, samples=16, seed=4)
    assert torch.equal(tours, again[0]) and torch.equal(lengths, again[1])
    assert not torch.equal(tours, sampled_best(tiny, coords, samples=16, seed=5)[0])
    samples = rollouts(tiny, coords, samples=16, generator=torch.Generator().manual_seed(4))
    each = tour_length(coords.repeat_interleave(16, 0), samples.flatten(0, 1)).view(6, 16)
    assert torch.equal(lengths, each.min(1).values) and (lengths[:, None] <= each).all()
    cold = rollouts(tiny, coords, samples=4, temperature=1e-4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(cold, tiny(coords)[0][:, None].expand(-1, 4, -1))   # temperature → 0: greedy


@pytest.mark.parametrize("options,message", [
    (dict(augment=4), "augment: 4 views; give 1"), (dict(starts=10), "starts: 10 first cities for 9-city"),
    (dict(starts=-1), "starts: -1"), (dict(samples=-2), "samples: -2"), (dict(temperature=0.0), "temperature: 0.0"),
    (dict(temperature=float("nan")), "temperature: nan"), (dict(max_rollouts=0), "max_rollouts: 0"),
])
def test_bad_options_are_one_line_errors(tiny, options, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        best_tours(tiny, random_instances(2, 9, seed=0), **options)
    check_inference_options(9, 8, 9, 3, 0.5, 1)          # the limits themselves are allowed


def test_the_shipped_tsp20_checkpoint_gains_from_every_mode():
    """am_tsp20.pt on 12 test instances: every mode's tours are permutations whose recomputed
    lengths are the ones returned; ×8 augmentation is never worse than greedy and multi-start
    with it never worse than multi-start alone (each contains the other's tours); every mode
    shortens the mean tour (measured on these instances: ×8 augmentation 0.49%, multi-start
    0.45%, both 0.63%, the best of 16 samples 0.22%)."""
    model, _ = load_model(CHECKPOINT, attention_fn=F.scaled_dot_product_attention)
    coords = random_instances(12, 20, seed=1_234_567_891)
    results = {name: fn() for name, fn in {
        "greedy": lambda: best_tours(model, coords),
        "augment": lambda: augmented_greedy(model, coords),
        "multi-start": lambda: multi_start_greedy(model, coords),
        "both": lambda: multi_start_greedy(model, coords, augment=8),
        "samples": lambda: sampled_best(model, coords, samples=16)}.items()}
    for tours, lengths in results.values():
        torch.testing.assert_close(tour_length(coords, tours), lengths)
    lengths = {name: lengths for name, (_, lengths) in results.items()}
    assert (lengths["augment"] <= lengths["greedy"]).all() and (lengths["both"] <= lengths["multi-start"]).all()
    for name in ("augment", "multi-start", "both", "samples"):
        assert lengths[name].mean() < lengths["greedy"].mean() * (1 - 0.001), name


def test_eval_tsp_reports_each_mode_and_saves_its_tours(tiny, tmp_path, capsys):
    save_model(tiny, tmp_path / "am.pt", n_nodes=8)
    out = tmp_path / "tours.npz"
    assert main(["eval-tsp", "--checkpoint", str(tmp_path / "am.pt"), "--instances", "3", "--multi-start",
                 "--augment", "8", "--samples", "2", "--temperature", "0.5", "--max-rollouts", "200",
                 "--save-tours", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ms per instance" in printed.splitlines()[1]                      # greedy's line
    described = describe_inference(augment=8, starts=8, samples=2, temperature=0.5)
    assert described == "multi-start ×8, ×8 augmentation, 2 samples at temperature 0.5 (seed 0) (best of 128 tours " \
                        "per instance)" and f"  {described}: mean tour length" in printed
    saved = load_tours(out)                                                 # checks lengths against the tours
    assert f"mean tour length {saved['lengths'].mean():.4f}" in printed.splitlines()[2]
    coords = torch.from_numpy(saved["coords"])
    _, expected = best_tours(tiny, coords, augment=8, starts=8, samples=2, temperature=0.5, max_rollouts=200)
    np.testing.assert_allclose(saved["lengths"], expected.numpy(), rtol=1e-6)


@pytest.mark.parametrize("argv,expected", [
    (["--temperature", "2"], "--temperature: only sampled tours use it; give --samples K too"),
    (["--sampling-seed", "3", "--multi-start"], "--sampling-seed: only sampled tours use it"),
    (["--samples", "2", "--temperature", "nan"], "--temperature: nan is not a finite number"),
    (["--samples", "2", "--temperature", "0"], "--temperature: 0.0 is out of range; give a value > 0"),
    (["--samples", "-1"], "--samples: -1 is out of range"),
    (["--augment", "4"], "--augment: invalid choice: 4 (choose from 1, 8)"),
    (["--max-rollouts", "0"], "--max-rollouts: 0 is out of range"),
])
def test_eval_tsp_refuses_bad_inference_options_in_one_line(argv, expected, capsys):
    try:
        code = main(["eval-tsp", "--checkpoint", CHECKPOINT, "--instances", "2", *argv])
    except SystemExit as exit_:                          # argparse's own errors
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2 and captured.err.count("\n") == 1 and expected in captured.err, captured.err
    assert captured.out == ""
