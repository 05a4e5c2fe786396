"""The trainer on CPU: precision modes, schedule, accumulation, clipping after unscaling,
activation checkpointing, resume, the NaN guard, DDP with gloo, and the command line."""

import dataclasses
import math
import os
import signal
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

from flashlab.train import checkpoint
from flashlab.train.config import ConfigError, apply_changes
from flashlab.train.documents import DocumentsConfig
from flashlab.train.tasks import IGNORE_INDEX, AssociativeRecall, lookback
from flashlab.train.trainer import (
    RecallConfig,
    RunConfig,
    Trainer,
    TrainingDiverged,
    TrainingInterrupted,
    lr_factor,
    read_metrics,
    train,
    train_in_phases,
)
from flashlab.train.tsp_train import TSPConfig

TASK = RecallConfig(seq_len=32, num_pairs=4, vocab_size=32, d_model=32, n_layers=2, n_heads=2, attention="sdpa")
RUN = RunConfig(batch_size=8, steps=4, warmup_steps=2, progress=False, device="cpu")


def tiny(**changes):
    """(task, run): the tiny configs with ``changes`` applied to whichever owns each field."""
    return apply_changes((TASK, RUN), changes)


def _params(trainer):
    return [p.detach().clone().float() for p in trainer.model.parameters()]


def test_task_is_a_function_of_the_seed_and_answers_are_values():
    task = AssociativeRecall(seq_len=40, num_pairs=6, vocab_size=32)
    x, y = task.batch(3, seed=7)
    assert torch.equal(x, task.batch(3, seed=7)[0]) and not torch.equal(x, task.batch(3, seed=8)[0])
    answered = y != IGNORE_INDEX
    assert (answered.sum(1) == task.targets_per_example).all()
    assert (y[answered] >= 16).all(), "answers are value tokens (upper half of the vocabulary)"
    for row in range(3):   # each answer is the value paired with the key just before it in the context
        pairs = dict(zip(x[row, 0:12:2].tolist(), x[row, 1:12:2].tolist()))
        for t in answered[row].nonzero().flatten().tolist():
            assert pairs[x[row, t].item()] == y[row, t].item()


def test_sparse_queries_ask_at_the_rate_and_fill_the_rest():
    dense = AssociativeRecall(seq_len=4000, num_pairs=8, vocab_size=32)
    sparse = AssociativeRecall(seq_len=4000, num_pairs=8, vocab_size=32, query_rate=0.1)
    x, y = sparse.batch(4, seed=3)
    answered = y != IGNORE_INDEX
    rate = answered.sum().item() / (4 * dense.targets_per_example)
    assert 0.08 < rate < 0.12, rate                                   # about 10% of the slots ask
    for row in range(4):
        pairs = dict(zip(x[row, 0:16:2].tolist(), x[row, 1:16:2].tolist()))
        for t in answered[row].nonzero().flatten().tolist():          # every answer is the key's value
            assert pairs[x[row, t].item()] == y[row, t].item()
        silent = ~answered[row, 16::2]
        assert (x[row, 16::2][silent] >= 16).all(), "a slot that does not ask holds filler, never a key"
    lookbacks = lookback(x)[answered].float()
    dense_lookbacks = lookback(dense.batch(4, seed=3)[0])[dense.batch(4, seed=3)[1] != IGNORE_INDEX].float()
    assert lookbacks.mean() > 5 * dense_lookbacks.mean()              # ~2P/rate = 160 tokens vs ~16
    with pytest.raises(ValueError, match="query_rate"):
        AssociativeRecall(query_rate=0.0)


@pytest.mark.parametrize("n", [1, 2, 17, 1000])
def test_lookback_is_the_distance_to_the_previous_occurrence(n):
    tokens = torch.randint(0, 7, (3, n))
    expected = torch.zeros_like(tokens)
    for row in range(3):
        last = {}
        for t, token in enumerate(tokens[row].tolist()):
            expected[row, t] = t - last[token] if token in last else 0
            last[token] = t
    assert torch.equal(lookback(tokens), expected)


def test_accuracy_by_lookback_adds_up_to_the_accuracy():
    trainer = train(*tiny(steps=20, query_rate=0.5))
    rows = trainer.evaluate_by_lookback(edges=(0, 1, 8, 10**6), batches=2, seed=5)
    assert [r["lookback_from"] for r in rows] == [0, 1, 8]
    assert rows[1]["answers"] > 0 and rows[2]["answers"] > 0
    assert rows[0]["answers"] == 0 and math.isnan(rows[0]["accuracy"])   # 0 = never seen: every key is in the context
    correct = sum(r["accuracy"] * r["answers"] for r in rows if r["answers"])
    assert correct / sum(r["answers"] for r in rows) == pytest.approx(trainer.evaluate(batches=2, seed=5))


def test_learning_rate_warms_up_then_decays_by_cosine():
    factors = [lr_factor(s, 10, 100, 0.1) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[9:], factors[10:]))
    assert lr_factor(100, 10, 100, 0.1) == pytest.approx(0.1)
    assert lr_factor(55, 10, 100, 0.1) == pytest.approx(0.55)            # half-way: the cosine's midpoint


@pytest.mark.parametrize("precision,param_dtype", [("32-true", torch.float32), ("bf16-mixed", torch.float32),
                                                   ("16-mixed", torch.float32), ("bf16-true", torch.bfloat16),
                                                   ("16-true", torch.float16)])
def test_every_precision_mode_trains_on_cpu(precision, param_dtype):
    trainer = Trainer(*tiny(precision=precision, steps=3))
    before = _params(trainer)
    history = trainer.fit()
    assert all(p.dtype == param_dtype for p in trainer.model.parameters())
    assert all(math.isfinite(m["loss"]) for m in history)
    assert any(not torch.equal(a, b.float()) for a, b in zip(before, trainer.model.parameters()))
    if precision == "16-mixed":
        assert history[0]["loss_scale"] == 65536.0          # GradScaler's initial scale


def test_flashlab_attention_in_the_trainer():
    """The Triton kernels inside the model (the interpreter on CPU: one tiny step), giving
    the same loss and gradient norm as SDPA."""
    config = tiny(batch_size=2, steps=1)
    ours, theirs = train(*config, attention="flashlab"), train(*config)
    assert ours.history[0]["loss"] == pytest.approx(theirs.history[0]["loss"], rel=1e-5)
    assert ours.history[0]["grad_norm"] == pytest.approx(theirs.history[0]["grad_norm"], rel=1e-4)


def test_learns_associative_recall():
    trainer = train(*tiny(steps=150, warmup_steps=10, batch_size=32))
    first, last = trainer.history[0]["loss"], sum(m["loss"] for m in trainer.history[-10:]) / 10
    assert last < first - 1.0, (first, last)


def test_gradient_accumulation_equals_the_full_batch():
    full = train(*tiny(steps=3))
    accumulated = train(*tiny(steps=3, grad_accum=4))
    for a, b in zip(full.model.parameters(), accumulated.model.parameters()):   # summation order: rounding only
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_clipping_sees_unscaled_gradients():
    """16-mixed multiplies the loss by 65536; the norm that clipping sees must be the true one."""
    mixed = train(*tiny(precision="16-mixed", steps=1))
    exact = train(*tiny(precision="32-true", steps=1))
    assert mixed.history[0]["grad_norm"] == pytest.approx(exact.history[0]["grad_norm"], rel=2e-2)
    clipped = Trainer(*tiny(precision="16-mixed", grad_clip=1e-3, lr=1.0, warmup_steps=1,
                                          weight_decay=0.0))
    before = _params(clipped)
    clipped.train_step()
    # AdamW's first step moves every weight by about lr; clipping changes the direction only,
    # so check instead that the gradient the optimizer saw had norm ≤ 1e-3 (its second moment)
    second_moments = [s["exp_avg_sq"] for s in clipped.optimizer.state.values()]
    assert math.sqrt(sum(v.sum().item() for v in second_moments) / (1 - 0.95)) <= 1e-3 * 1.01
    assert any(not torch.equal(a, b) for a, b in zip(before, _params(clipped)))


def test_activation_checkpointing_gives_the_same_training():
    plain = train(*tiny(steps=3))
    recomputed = train(*tiny(steps=3, checkpoint_blocks=True))
    assert [m["loss"] for m in plain.history] == pytest.approx([m["loss"] for m in recomputed.history], rel=1e-6)


@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"])
def test_resume_reproduces_the_uninterrupted_run(tmp_path, precision):
    """With dropout on, the run depends on the RNG state too: model, optimizer, scheduler,
    scaler, step and RNG must all come back, in every precision mode."""
    config = tiny(steps=6, dropout=0.1, precision=precision)
    straight = train(*config)
    interrupted = _Interrupted(*apply_changes(config, {"out_dir": str(tmp_path), "checkpoint_every": 3}))
    interrupted.stop_at = 4
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()                                   # dies in step 4, after the step-3 checkpoint
    resumed = train(*config, resume=str(tmp_path / "checkpoint_last.pt"), out_dir=str(tmp_path))
    assert all(math.isfinite(m["loss"]) for m in resumed.history)
    assert [m["loss"] for m in resumed.history] == [m["loss"] for m in straight.history]
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    assert [int(r["step"]) for r in read_metrics(tmp_path / "metrics.csv")] == list(range(6))   # each step once


def test_resume_refuses_another_model_or_task_and_lists_every_mismatch(tmp_path):
    train(*tiny(steps=2, out_dir=str(tmp_path)))
    last = str(tmp_path / "checkpoint_last.pt")
    with pytest.raises(ValueError, match=r"^resume: .*n_heads is 4 but the checkpoint has 2; "
                                         r"vocab_size|^resume: .*vocab_size is 64 .*n_heads is 4"):
        Trainer(*tiny(n_heads=4, vocab_size=64, resume=last))
    with pytest.raises(ValueError, match="seq_len is 64 but the checkpoint's learned position table has 32"):
        Trainer(*tiny(seq_len=64, resume=last))
    with pytest.raises(ValueError, match="precision is '16-true' but the checkpoint has '32-true'"):
        Trainer(*tiny(precision="16-true", resume=last))
    # fields that may change do: steps, logging, time limit, query rate, attention, batch
    resumed = Trainer(*tiny(steps=3, log_every=1, time_limit_min=5.0, query_rate=0.5, batch_size=4, resume=last))
    assert resumed.step == 2 and resumed.run.steps == 3 and resumed.task.query_rate == 0.5


def test_a_new_learning_rate_applies_on_resume(tmp_path):
    """The scheduler's state holds the old base lr; resuming with another lr must use the new
    one (and the new warm-up/decay), not silently keep the old."""
    train(*tiny(steps=3, lr=1e-3, warmup_steps=0, min_lr_ratio=1.0, out_dir=str(tmp_path)))
    resumed = train(*tiny(steps=5, lr=0.25, warmup_steps=0, min_lr_ratio=1.0,
                          resume=str(tmp_path / "checkpoint_last.pt")))
    assert [m["lr"] for m in resumed.history] == pytest.approx([1e-3] * 3 + [0.25] * 2)
    assert all(g["lr"] == pytest.approx(0.25) for g in resumed.optimizer.param_groups)


def test_metrics_continue_exactly_after_resuming_an_earlier_checkpoint(tmp_path):
    """A run that wrote rows past its last checkpoint (then died) redoes those steps: their
    rows are replaced, not repeated."""
    train(*tiny(steps=7, out_dir=str(tmp_path), checkpoint_every=4))      # rows 0…6, checkpoint_4 and _last (7)
    train(*tiny(steps=12, out_dir=str(tmp_path), resume=str(tmp_path / "checkpoint_4.pt")))
    assert [int(r["step"]) for r in read_metrics(tmp_path / "metrics.csv")] == list(range(12))


def test_a_fresh_run_refuses_a_directory_that_holds_another(tmp_path):
    """A practitioner's trial: the command line refused an --out-dir holding a run, but train() and
    Trainer.fit() cut its metrics.csv back to step 0, replaced checkpoint_last.pt, and left the old
    run's checkpoint_<step>.pt beside the new run's. Now they refuse too, in one line naming out_dir;
    the old run is untouched, resuming it still works, and a trainer's second fit() continues its run."""
    trainer = train(*tiny(steps=4, out_dir=str(tmp_path), checkpoint_every=2))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ConfigError, match=rf"^out_dir: {tmp_path} holds a run already \(checkpoint_last.pt\); "
                                          r"continue it with resume='.*checkpoint_last.pt', give another out_dir"):
        train(*tiny(steps=2, out_dir=str(tmp_path)))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    stopped = tmp_path / "stopped"                               # a run stopped before its first checkpoint
    stopped.mkdir()
    (stopped / "metrics.csv").write_bytes(before["metrics.csv"])
    with pytest.raises(ConfigError, match=r"holds a run already \(metrics.csv\); give another out_dir"):
        Trainer(*tiny(steps=2, out_dir=str(stopped))).fit()
    (tmp_path / "checkpoint_last.pt").unlink()                  # a run killed in its save of checkpoint_last.pt
    with pytest.raises(ConfigError, match=r"whose save of checkpoint_last.pt was cut short; its newest complete "
                                          rf"checkpoint is {tmp_path / 'checkpoint_4.pt'} \(step 4\): continue it "
                                          r"with resume="):
        Trainer(*tiny(steps=2, out_dir=str(tmp_path))).fit()
    trainer.run = apply_changes((trainer.run,), {"steps": 6})[0]
    trainer.fit()                                                 # the same trainer continues its own run
    assert [int(r["step"]) for r in read_metrics(tmp_path / "metrics.csv")] == list(range(6))
    resumed = train(*tiny(steps=7, out_dir=str(tmp_path), resume=str(tmp_path / "checkpoint_4.pt")))
    assert resumed.step == 7


class _Interrupted(Trainer):
    """A run killed in the middle of step ``stop_at``."""

    stop_at = 5

    def compute_loss(self, inputs, targets):
        if self.step == self.stop_at:
            raise KeyboardInterrupt
        return super().compute_loss(inputs, targets)


class _NaNAt(Trainer):
    """A trainer whose loss is NaN at chosen steps (all steps from `always_from` on)."""

    bad_steps: set = set()
    always_from = 10**9

    def compute_loss(self, inputs, targets):
        loss, correct, answers = super().compute_loss(inputs, targets)
        if self.step in self.bad_steps or self.step >= self.always_from:
            loss = loss * float("nan")
        return loss, correct, answers


def test_nan_guard_skips_and_counts_bad_steps():
    trainer = _NaNAt(*tiny(steps=5))
    trainer.bad_steps = {2}
    trainer.train_step(), trainer.train_step()
    before = _params(trainer)
    metrics = trainer.train_step()
    assert metrics["skipped"] == 1 and trainer.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, _params(trainer))), "a skipped step must not update"
    assert trainer.train_step()["skipped"] == 0


def test_nan_guard_stops_after_k_bad_steps_in_a_row():
    trainer = _NaNAt(*tiny(steps=20, max_bad_steps=3))
    trainer.always_from = 1
    with pytest.raises(TrainingDiverged, match="3 consecutive steps"):
        trainer.fit()
    assert trainer.step == 4 and trainer.skipped_steps == 3


def test_max_bad_steps_zero_turns_the_stop_off():
    trainer = _NaNAt(*tiny(steps=6, max_bad_steps=0))
    trainer.always_from = 1
    history = trainer.fit()                                        # never raises: skips and counts only
    assert len(history) == 6 and trainer.skipped_steps == 5


def test_clear_errors():
    with pytest.raises(ValueError, match="^precision:"):
        Trainer(*tiny(precision="fp8"))
    with pytest.raises(ValueError, match="^batch_size:"):
        Trainer(*tiny(batch_size=6, grad_accum=4))
    with pytest.raises(ValueError, match="^attention:"):
        Trainer(*tiny(attention="fast"))
    with pytest.raises(ValueError, match="^n_heads: 3 does not divide d_model=32"):
        Trainer(*tiny(n_heads=3))
    with pytest.raises(ValueError, match="^num_pairs:"):
        Trainer(*tiny(num_pairs=40))
    with pytest.raises(TypeError, match="^task: a RunConfig"):
        Trainer(RUN, TASK)


def test_a_config_is_checked_by_type_with_or_without_postponed_annotations():
    """A practitioner's own config, in a module without ``from __future__ import annotations``,
    holds the types themselves, not their names: every field used to be taken for a string
    ("dim: 8 is not a string")."""
    from flashlab.train.config import ConfigError, check_fields, field_kind, option
    fields = [("dim", int, option(8, "a width", low=1)), ("rate", float, option(0.5, "a rate", low=0)),
              ("flag", bool, option(False, "a switch")), ("name", str, option("x", "a name")),
              ("limit", int | None, option(None, "a bound", low=0))]
    for annotate in (lambda kind: kind, lambda kind: getattr(kind, "__name__", None) or str(kind)):
        config = dataclasses.make_dataclass("Mine", [(name, annotate(kind), f) for name, kind, f in fields])
        assert [field_kind(f) for f in dataclasses.fields(config)] == [int, float, bool, str, int]
        check_fields(config())
        with pytest.raises(ConfigError, match="^dim: '8' is not an integer"):
            check_fields(config(dim="8"))
        with pytest.raises(ConfigError, match="^limit: -1 is out of range"):
            check_fields(config(limit=-1))


@pytest.mark.parametrize("build, message", [
    (lambda: RunConfig(steps=0), "^steps: 0 is out of range; give a value ≥ 1"),
    (lambda: RunConfig(precision="fp8"), "^precision: 'fp8' is not one of"),
    (lambda: RecallConfig(dropout=1.0), "^dropout: 1.0 is out of range"),
    (lambda: dataclasses.replace(TSPConfig(), n_nodes=2), "^n_nodes: 2 is out of range"),
    (lambda: DocumentsConfig(packing="tight"), "^packing: 'tight' is not one of")])
def test_a_bad_value_is_refused_when_the_config_is_built(build, message):
    """A practitioner's mistake surfaces on the line that makes it, not later when a Trainer is
    built from the config (elsewhere in their script, or never, for a config only saved)."""
    with pytest.raises(ConfigError, match=message):
        build()


def test_checks_across_fields_wait_for_training():
    """What depends on two fields or on the machine is checked by check(), when a Trainer is built: a
    config may be written on a CPU for a GPU run."""
    config = RecallConfig(d_model=64, n_heads=3)                  # builds
    with pytest.raises(ConfigError, match="^n_heads: 3 does not divide d_model=64"):
        config.check()
    run = RunConfig(device="cuda", compile="reduce-overhead")    # builds on a CPU too
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="^device: cuda was asked for"):
            run.check()


def test_the_divergence_message_suggests_bf16_only_to_fp16_runs():
    for precision, advice in (("32-true", "Lower lr or check the data;"),
                              ("16-mixed", "Lower lr, use bf16-mixed instead of 16-mixed, or check the data;")):
        trainer = _NaNAt(*tiny(steps=20, max_bad_steps=2, precision=precision))
        trainer.always_from = 0
        with pytest.raises(TrainingDiverged, match=advice):
            trainer.fit()


def test_the_process_group_backend_follows_the_runs_device(monkeypatch):
    """A CPU run under torchrun on a machine with GPUs: the backend was NCCL because a GPU was
    visible, and DDP's first collective on the CPU parameters failed ("No backend type associated
    with device type cpu", on an H100). gloo for cpu, NCCL for cuda, whatever the machine has."""
    from flashlab.train import trainer as train_module
    chosen = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(train_module.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(train_module.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(train_module.dist, "init_process_group", chosen.append)
    monkeypatch.setattr(train_module.dist, "get_rank", lambda: 0)
    for device in ("cpu", "cuda"):
        train_module._distributed(device)
    assert chosen == ["gloo", "nccl"]


def _ddp_worker(rank, world, port, config, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    trainer = train(*config)
    torch.save([p.detach() for p in trainer.model.parameters()], f"{out}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


def test_ddp_two_processes_match_one_process(tmp_path):
    """Two gloo replicas, each with half of every batch: identical to each other, and equal
    (to float rounding) to one process that sees the whole batch."""
    config = tiny(steps=3)
    _two_ranks(_ddp_worker, (config, str(tmp_path)))
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert all(torch.equal(a, b) for a, b in zip(rank0, rank1)), "replicas diverged"
    single = train(*config)
    for a, b in zip(single.model.parameters(), rank0):   # gradients summed in another order: rounding only
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


class _StoppedOnOneRank(Trainer):
    """A distributed run where only rank 1 is sent SIGTERM (after step 1), or whose ranks' clocks
    run at different speeds (rank 0's 10 s a step, rank 1's 1 s), as they do: each times its own steps."""
    signal_rank1_after = None

    def __init__(self, *args):
        super().__init__(*args)
        ticks = iter(range(0, 10**6, 10 if self.rank == 0 else 1))
        self.clock = lambda: float(next(ticks))

    def on_step_end(self, metrics):
        if self.rank == 1 and metrics["step"] == self.signal_rank1_after:
            os.kill(os.getpid(), signal.SIGTERM)


def _ddp_stop_worker(rank, world, port, config, signal_after, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    trainer = _StoppedOnOneRank(*config)
    trainer.signal_rank1_after = signal_after
    try:
        trainer.fit()
        outcome = ("finished", trainer.step)
    except TrainingInterrupted as stopped:
        outcome = (stopped.signal_name, stopped.step)
    torch.save(outcome, f"{out}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _two_ranks(worker, args, timeout_s=120):
    """Runs ``worker`` on two gloo ranks; fails (after killing them) if they have not ended in time."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.spawn(worker, args=(2, port, *args), nprocs=2, join=False)
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=2):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the ranks had not ended after {timeout_s} s: one waits for the other")


def test_ddp_ranks_stop_together_when_one_is_signalled(tmp_path):
    """A practitioner's trial: under torchrun a SIGTERM saved nothing (the handler was off with more than
    one rank, because ranks stopping at different steps would wait for each other forever). Now each
    rank's wish to stop rides the step's all-reduce: rank 1 alone is signalled after step 1, and both
    ranks stop after step 2, rank 0 saving that step's state."""
    _two_ranks(_ddp_stop_worker, (tiny(steps=50, out_dir=str(tmp_path)), 1, str(tmp_path)))
    outcomes = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert outcomes == [("SIGTERM", 3), ("SIGTERM", 3)], outcomes
    assert checkpoint.load(tmp_path / "checkpoint_last.pt").state["step"] == 3
    assert [int(r["step"]) for r in read_metrics(tmp_path / "metrics.csv")] == [0, 1, 2]


def test_ddp_ranks_stop_together_at_the_time_limit(tmp_path):
    """Each rank times its own steps, and rank 0 also writes the CSV: its clock reaches the time limit
    first (here at 30 s, after 3 of its 10 s steps; rank 1's after 30). Rank 0's clock decides for
    every rank, told through the step's all-reduce, so the ranks stop together, one step after rank 0's
    clock passed the limit (a single process stops before that step)."""
    _two_ranks(_ddp_stop_worker, (tiny(steps=50, time_limit_min=0.5), None, str(tmp_path)))
    outcomes = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert outcomes == [("finished", 4), ("finished", 4)], outcomes


def test_command_line_trains_and_writes_metrics(tmp_path):
    result = subprocess.run([sys.executable, "-m", "flashlab", "train", "--steps", "3", "--seq-len", "32",
                             "--num-pairs", "4", "--vocab-size", "32", "--no-progress", "--out-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "steps 3, skipped 0" in result.stdout
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0].startswith("step,loss,accuracy") and len(lines) == 4
    assert (tmp_path / "checkpoint_last.pt").exists()
    import matplotlib
    matplotlib.use("Agg")
    from flashlab.train.trainer import plot_metrics
    ax = plot_metrics({"cli run": tmp_path / "metrics.csv"}, y="loss")
    assert ax.get_xlabel() == "optimizer step" and len(ax.lines[0].get_xdata()) == 3


def test_read_metrics_gives_floats_and_nan_for_empty(tmp_path):
    from flashlab.train.trainer import read_metrics
    path = tmp_path / "metrics.csv"
    path.write_text("step,loss,eval\n0,2.5,\n1,2.0,0.75\n")
    rows = read_metrics(path)
    assert rows[1] == {"step": 1.0, "loss": 2.0, "eval": 0.75} and math.isnan(rows[0]["eval"])


def test_train_in_phases_resumes_each_phase_from_the_last(tmp_path):
    task, run = tiny(steps=10**6, positions="rotary")     # no position table to outgrow
    phases = [("short", {"steps": 3}, 10.0), ("long", {"seq_len": 64, "query_rate": 0.5, "steps": 5}, 10.0)]
    seen = [(name, trainer.step, trainer.task_config.seq_len, trainer.train_seconds)
            for name, trainer in train_in_phases(task, run, phases, tmp_path)]
    assert [s[:3] for s in seen] == [("short", 3, 32), ("long", 5, 64)]   # the step count runs on
    assert seen[1][3] > seen[0][3] > 0                                     # so does the training clock
    assert (tmp_path / "long" / "checkpoint_last.pt").exists()
    assert len(read_metrics(tmp_path / "long" / "metrics.csv")) == 2          # the long phase took steps 3 and 4


def test_a_skipped_step_lets_no_lr_scheduler_warning_through():
    """16-mixed's first steps may overflow and be skipped (by design: the loss scale comes down);
    the schedule moves on regardless, and PyTorch's "lr_scheduler.step() before optimizer.step()"
    warning reached users of train-tsp there. Here every step overflows (a huge initial scale)."""
    import warnings

    from flashlab.train.trainer import RecallConfig, RunConfig, Trainer
    trainer = Trainer(RecallConfig(seq_len=16, num_pairs=2, vocab_size=16, d_model=16, n_heads=2, n_layers=1,
                                   attention="sdpa"),
                      RunConfig(precision="16-mixed", steps=2, batch_size=4, device="cpu", progress=False))
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 120)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer.fit()
    assert trainer.skipped_steps == 2
    assert not [w for w in seen if "lr_scheduler.step()" in str(w.message)]
