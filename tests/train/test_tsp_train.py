"""REINFORCE with a greedy-rollout baseline, the paired t-test, and the trainer hooks it uses."""

import csv
import dataclasses
import math

import pytest
import torch

from flashlab.cli import main
from flashlab.train.config import ConfigError, apply_changes
from flashlab.train.trainer import TrainingDiverged
from flashlab.train.tsp import random_instances, tour_length
from flashlab.train.tsp_train import (
    KOOL_RUN,
    TSPConfig,
    TSPTrainer,
    paired_t_test_less,
    shared_baseline_advantage,
    student_t_cdf,
)

TASK = TSPConfig(n_nodes=6, epoch_steps=2, eval_instances=32, d_model=16, n_heads=2, n_layers=1, ff_dim=32,
                 attention="sdpa")
RUN = dataclasses.replace(KOOL_RUN, batch_size=16, steps=4, device="cpu", progress=False, lr=1e-3)


def tiny(**changes):
    return apply_changes((TASK, RUN), changes)


class FakeClock:
    """A training clock that advances ``tick`` seconds per reading: the time limit then
    depends on the number of steps, not on how busy the machine is."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def __call__(self):
        self.now += self.tick
        return self.now


@pytest.mark.parametrize("t,df,cdf", [(2.228, 10, 0.975), (-2.0, 10, 0.0367), (0.0, 3, 0.5), (-12.706, 1, 0.025),
                                      (1.645, 10**6, 0.95)])
def test_student_t_cdf_matches_tables(t, df, cdf):
    assert student_t_cdf(t, df) == pytest.approx(cdf, abs=2e-4)


def test_paired_t_test():
    torch.manual_seed(0)
    b = torch.rand(1000) + 3
    t, p = paired_t_test_less(b - 0.05 + 0.01 * torch.randn(1000), b)
    assert t < 0 and p < 1e-10
    _, p_same = paired_t_test_less(b + 0.01 * torch.randn(1000), b)
    assert 0.001 < p_same < 0.999


def test_trains_and_tests_the_baseline_every_epoch(tmp_path):
    trainer = TSPTrainer(TASK, RUN)
    history = trainer.fit()
    assert all(m["tour_length"] > 0 for m in history)
    tested = [m for m in history if not math.isnan(m["t_test_p"])]
    assert [m["step"] for m in tested] == [1, 3]                     # after steps 2 and 4
    trainer.export(tmp_path / "am.pt")
    assert main(["eval-tsp", "--checkpoint", str(tmp_path / "am.pt"), "--nodes", "6", "--instances", "8"]) == 0


@pytest.mark.parametrize("precision", ["16-true", "bf16-true"])
def test_trains_with_the_model_itself_in_half_precision(precision):
    """The model cast to fp16/bf16 takes the fp32 coordinates in its own dtype (a crash before:
    Linear's mat1 and mat2 differed), and the fp32 baseline copy made before the cast rolls out too."""
    trainer = TSPTrainer(TASK, dataclasses.replace(RUN, precision=precision, steps=1))
    assert next(trainer.model.parameters()).dtype == {"16-true": torch.float16, "bf16-true": torch.bfloat16}[precision]
    history = trainer.fit()
    assert all(math.isfinite(m["tour_length"]) and m["tour_length"] > 0 for m in history)


def test_activations_that_overflow_stop_the_run_with_what_to_change(monkeypatch):
    """An encoder whose activations overflow (fp16's range) gives NaN log-probabilities, and greedy
    decoding then repeats a city: the epoch's rollout says so in one line instead of failing later in
    tour_length's check."""
    trainer = TSPTrainer(TASK, dataclasses.replace(RUN, precision="16-true", steps=2))
    monkeypatch.setattr(trainer.model, "encode", lambda coords: torch.full((*coords.shape[:2], 16), float("inf"),
                                                                           dtype=torch.float16))
    with pytest.raises(TrainingDiverged, match=r"repeated cities.*16-true.*Use bf16-mixed"):
        trainer.greedy_lengths(trainer.model)


@pytest.mark.parametrize("candidate_shift,noise,updated",
                         [(-0.1, 0.01, True), (-0.001, 0.5, False), (0.1, 0.01, False)])
def test_baseline_replaced_only_when_significantly_better(monkeypatch, candidate_shift, noise, updated):
    trainer = TSPTrainer(*tiny(steps=2))
    torch.manual_seed(1)
    current = torch.rand(200) + 3
    candidate = current + candidate_shift + noise * torch.randn(200)
    monkeypatch.setattr(trainer, "greedy_lengths", lambda model: candidate if model is trainer.model else current)
    with torch.no_grad():
        next(trainer.model.parameters()).add_(1.0)                    # make policy and baseline differ
    trainer.step = 2
    metrics = {}
    trainer.on_step_end(metrics)
    same = all(torch.equal(a, b) for a, b in zip(trainer.model.state_dict().values(),
                                                 trainer.baseline.state_dict().values()))
    assert metrics["baseline_updated"] == int(updated) and same == updated


def test_checkpoint_keeps_the_baseline(tmp_path):
    trainer = TSPTrainer(*tiny(out_dir=str(tmp_path)))
    trainer.fit()
    resumed = TSPTrainer(*tiny(resume=str(tmp_path / "checkpoint_last.pt")))
    for a, b in zip(trainer.baseline.state_dict().values(), resumed.baseline.state_dict().values()):
        assert torch.equal(a, b)
    assert resumed.baseline_updates == trainer.baseline_updates and resumed.step == 4


def test_train_tsp_command_line_exports_a_checkpoint_eval_tsp_reads(tmp_path, capsys):
    assert main(["train-tsp", "--n-nodes", "6", "--batch-size", "8", "--steps", "2", "--epoch-steps", "2",
                 "--eval-instances", "16", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--ff-dim", "32",
                 "--attention", "sdpa", "--device", "cpu", "--no-progress", "--out-dir", str(tmp_path)]) == 0
    assert "baseline updates" in capsys.readouterr().out
    assert main(["eval-tsp", "--checkpoint", str(tmp_path / "am_tsp6.pt"), "--nodes", "6", "--instances", "8"]) == 0
    assert "train_minutes=" in capsys.readouterr().out


def test_epoch_rollouts_equal_one_rollout_per_step():
    """The baseline's tours, computed for a whole epoch at once in big batches, are the ones
    a rollout on each step's own instances would give."""
    trainer = TSPTrainer(*tiny(epoch_steps=3, rollout_batch=5))
    for step in (0, 2, 4):
        coords, baseline_lengths = trainer.global_batch(step)
        with torch.no_grad():
            per_step = tour_length(coords, trainer.baseline(coords, "greedy")[0])
        torch.testing.assert_close(baseline_lengths, per_step, rtol=1e-6, atol=1e-6)
        assert torch.equal(coords, random_instances(RUN.batch_size, TASK.n_nodes, RUN.seed * 1_000_003 + step))


def test_time_limit_counts_across_resumes_and_csv_columns_stay_aligned(tmp_path):
    """Each step takes 1 s of a fake clock: a 5.5 s limit stops after 6 steps, a resume with
    8.5 s after 3 more, however busy the machine is."""
    first = TSPTrainer(*tiny(steps=1000, out_dir=str(tmp_path), time_limit_min=5.5 / 60))
    first.clock = FakeClock(1.0)
    first.fit()
    assert first.step == 6 and first.train_seconds == 6.0
    resumed = TSPTrainer(*tiny(steps=1000, out_dir=str(tmp_path), time_limit_min=8.5 / 60,
                               resume=str(tmp_path / "checkpoint_last.pt")))
    assert resumed.train_seconds == 6.0                                      # the clock came back with the state
    resumed.clock = FakeClock(1.0)
    resumed.fit()
    assert resumed.step == 9 and resumed.train_seconds == 9.0
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert all(len(row) == len(rows[0]) for row in rows) and len(rows) == resumed.step + 1
    header = rows[0]
    assert "instances_per_s" in header and "tokens_per_s" not in header     # TSP counts its own work
    tested = [row for row in rows[1:] if row[header.index("t_test_p")] != "nan"]
    assert len(tested) == resumed.step // TASK.epoch_steps


def test_tsp_config_has_no_language_model_fields_and_resume_checks_the_task(tmp_path):
    names = {f.name for f in dataclasses.fields(TSPConfig)}
    assert not names & {"seq_len", "num_pairs", "vocab_size", "query_rate", "dropout", "positions",
                        "rotary_fraction", "checkpoint_blocks"}
    trainer = TSPTrainer(*tiny(steps=2, out_dir=str(tmp_path)))
    trainer.fit()
    with pytest.raises(ValueError, match=r"^resume: .*n_nodes is 7 but the checkpoint has 6"):
        TSPTrainer(*tiny(n_nodes=7, resume=str(tmp_path / "checkpoint_last.pt")))


def test_cuda_graphs_are_refused_on_a_cpu(monkeypatch):
    """A learner trial: --compile reduce-overhead --device cpu compiled for minutes, silently,
    then replayed no CUDA graph. Refused at once, with --device cpu, and with auto on a machine
    without a GPU; on a GPU (here: a pretended one) auto and cuda take it."""
    with pytest.raises(ConfigError, match=r"^compile: reduce-overhead is GPU only, as it replays CUDA graphs, and "
                                          r"the device is cpu; on a CPU give off, or default"):
        TSPTrainer(*tiny(compile="reduce-overhead"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="^compile: .* no GPU was found, so device auto runs on the CPU"):
        dataclasses.replace(RUN, device="auto", compile="reduce-overhead").check()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for device in ("auto", "cuda"):
        dataclasses.replace(RUN, device=device, compile="reduce-overhead").check()
    dataclasses.replace(RUN, device="cpu", compile="default").check()


def test_compiled_training_steps_match_eager_ones(monkeypatch):
    """--compile: the training step goes through torch.compile and trains the same weights. The
    TSP model with flashlab attention (a boolean key mask in the decoder, sampling) is traced
    whole (fullgraph: no graph break); aot_eager stands in for inductor, whose C++ compile would
    take half a minute here (inductor itself: 4 steps on this CPU matched eager to 1e-7)."""
    modes, calls = [], []
    real_compile = torch.compile

    def compile_whole(model, mode=None):
        modes.append(mode)
        compiled = real_compile(model, backend="aot_eager", fullgraph=True)
        return lambda *args, **kwargs: calls.append(args[1:]) or compiled(*args, **kwargs)
    monkeypatch.setattr(torch, "compile", compile_whole)
    torch._dynamo.reset()
    histories = {}
    for compile_mode in ("off", "default"):                # reduce-overhead is GPU only: refused on this CPU
        trainer = TSPTrainer(*tiny(n_nodes=5, steps=2, batch_size=4, eval_instances=8, attention="flashlab",
                                   compile=compile_mode))
        histories[compile_mode] = trainer.fit()
        assert (trainer.forward_model is trainer.model) == (compile_mode == "off")
    assert modes == [None] and calls == [("sample",)] * 2, "each training step ran the compiled model"
    for eager, compiled in zip(histories["off"], histories["default"]):
        for key in ("loss", "tour_length", "grad_norm"):
            assert compiled[key] == pytest.approx(eager[key], rel=1e-5, abs=1e-6), key


def test_shared_baseline_advantage_is_against_each_instances_own_mean():
    lengths = torch.tensor([[1.0, 2.0, 3.0, 6.0], [10.0, 10.0, 12.0, 8.0]])
    advantage = shared_baseline_advantage(lengths)
    assert torch.equal(advantage, torch.tensor([[-2.0, -1.0, 0.0, 3.0], [0.0, 0.0, 2.0, -2.0]]))


def test_shared_baseline_loss_and_its_gradient():
    """POMO's loss, against the formula written out tour by tour: tour j of instance i starts at
    city j, its log-probability is the sum of its n − 1 decoded steps' (the forced first city
    adds none), and the loss is mean over i, j of (L_ij − mean_k L_ik) · log p_ij."""
    trainer = TSPTrainer(*tiny(baseline="shared", n_nodes=5))
    model, coords = trainer.model, random_instances(3, 5, seed=9)
    torch.manual_seed(0)
    loss, total, count = trainer.compute_loss(coords, None)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    torch.manual_seed(0)                                   # the same samples again, the trace kept
    trace = []
    tours, log_p = model(coords, "sample", trace, multi_start=True)
    assert len(trace) == 4 and torch.equal(tours[:, 0], torch.arange(5).repeat(3))
    rows = torch.arange(15)
    steps = torch.stack([trace[t][rows, tours[:, t + 1]] for t in range(4)], 1)
    torch.testing.assert_close(log_p, steps.log().sum(1))
    expected = 0.0
    for i in range(3):
        lengths = [tour_length(coords[i:i + 1], tours[5 * i + j][None]).item() for j in range(5)]
        for j in range(5):
            expected = expected + (lengths[j] - sum(lengths) / 5) * log_p[5 * i + j] / 15
    assert count.item() == 15 and total.item() == pytest.approx(tour_length(coords.repeat_interleave(5, 0),
                                                                            tours).sum().item(), rel=1e-6)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    reference = torch.autograd.grad(expected, list(model.parameters()), allow_unused=True)
    names = [name for name, _ in model.named_parameters()]
    for name, g, r in zip(names, grads, reference):
        if name == "first_placeholder":                    # never decoded: no gradient
            assert g is None and r is None
        else:
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6, msg=name)


def test_shared_baseline_trains_and_is_evaluated_by_multi_start(tmp_path):
    """Ten steps of POMO's training at 10 cities shorten multi-start greedy's tours on the fixed
    evaluation set (measured: 3.57 → 3.30); no t-test runs and no copy is rolled out."""
    trainer = TSPTrainer(*tiny(baseline="shared", n_nodes=10, steps=10, epoch_steps=10, batch_size=32,
                               eval_instances=200, lr=3e-3))
    before = trainer.evaluate()
    history = trainer.fit()
    assert trainer.evaluate() < 0.97 * before
    assert all(math.isnan(m["t_test_p"]) and m["baseline_updated"] == 0 for m in history)
    assert math.isfinite(history[-1]["eval_tour_length"]) and trainer._epoch is None
    trainer.export(tmp_path / "am.pt")
    assert main(["eval-tsp", "--checkpoint", str(tmp_path / "am.pt"), "--instances", "4", "--multi-start"]) == 0
