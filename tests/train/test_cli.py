"""Every command checks its arguments before doing work: a user error exits with status 2
and one line that names the option and says what to give, never a traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashlab.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = ROOT / "checkpoints"
TSP_MODEL, TSP_STATE, LM_MODEL = (str(CHECKPOINTS / n) for n in ("am_tsp20.pt", "tsp50_training_state.pt",
                                                                   "mqar_long.pt"))
NO_GPU = not torch.cuda.is_available()

# (arguments, what the one line must contain: the option and the reason)
BAD = [
    (["bench-softmax", "--rows", "0"], "--rows: 0 is out of range; give a value ≥ 1"),
    (["bench-softmax", "--rows", "abc"], "--rows: 'abc' is not an integer"),
    (["bench-softmax", "--cols", "128", "-4"], "--cols: -4 is out of range"),
    (["bench-softmax", "--dtype", "float64"], "--dtype: invalid choice: 'float64'"),
    (["bench-softmax", "--out", "/proc/flashlab/x.json"], "--out: cannot write into /proc/flashlab"),
    (["bench", "--seq-lens", "0"], "--seq-lens: 0 is out of range"),
    (["bench", "--heads", "0"], "--heads: 0 is out of range"),
    (["bench", "--head-dims", "-1"], "--head-dims: -1 is out of range"),
    (["bench", "--tokens", "0"], "--tokens: 0 is out of range"),
    (["bench", "--masks", "diagonal"], "--masks: invalid choice: 'diagonal'"),
    (["bench", "--dtypes", "float32"], "--dtypes: invalid choice: 'float32'"),
    (["bench", "--rep-ms", "0"], "--rep-ms: 0 is out of range"),
    (["bench", "--warmup-ms", "-1"], "--warmup-ms: -1 is out of range"),
    (["bench", "--flex-seq-lens", "0"], "--flex-seq-lens: 0 is out of range"),
    (["train", "--grad-accum", "0"], "--grad-accum: 0 is out of range"),
    (["train", "--n-heads", "0"], "--n-heads: 0 is out of range"),
    (["train", "--log-every", "0"], "--log-every: 0 is out of range"),
    (["train", "--batch-size", "0"], "--batch-size: 0 is out of range"),
    (["train", "--num-pairs", "0"], "--num-pairs: 0 is out of range"),
    (["train", "--d-model", "0"], "--d-model: 0 is out of range"),
    (["train", "--steps", "-1"], "--steps: -1 is out of range"),
    (["train", "--steps", "ten"], "--steps: 'ten' is not an integer"),
    (["train", "--time-limit-min", "-1"], "--time-limit-min: -1.0 is out of range; give a value ≥ 0"),
    (["train", "--precision", "fp8"], "--precision: invalid choice: 'fp8' (choose from '32-true'"),
    (["train", "--attention", "fast"], "--attention: invalid choice: 'fast'"),
    (["train", "--positions", "alibi"], "--positions: invalid choice: 'alibi'"),
    (["train", "--device", "tpu"], "--device: invalid choice: 'tpu'"),
    (["train", "--lr", "-1"], "--lr: -1.0 is out of range; give a value > 0"),
    (["train", "--lr", "nan"], "--lr: nan is not a finite number"),
    (["train", "--max-bad-steps", "-1"], "--max-bad-steps: -1 is out of range"),
    (["train", "--query-rate", "0"], "--query-rate: 0.0 is out of range; give a value in (0, 1]"),
    (["train", "--dropout", "1"], "--dropout: 1.0 is out of range; give a value in [0, 1)"),
    (["train", "--rotary-fraction", "0"], "--rotary-fraction: 0.0 is out of range"),
    (["train", "--min-lr-ratio", "2"], "--min-lr-ratio: 2.0 is out of range"),
    (["train", "--adam-beta2", "1"], "--adam-beta2: 1.0 is out of range"),
    (["train", "--n-heads", "3"], "--n-heads: 3 does not divide d_model=64"),
    (["train", "--num-pairs", "40"], "--num-pairs: 40 distinct keys need vocab_size ≥ 80"),
    (["train", "--seq-len", "8"], "--seq-len: 8 leaves no room for queries"),
    (["train", "--batch-size", "6", "--grad-accum", "4"], "--batch-size: 6 is not divisible by grad_accum"),
    (["train", "--out-dir", "/proc/flashlab-forbidden"], "--out-dir: cannot write to /proc/flashlab-forbidden"),
    (["train", "--resume", "/nonexistent/checkpoint_last.pt"], "--resume: /nonexistent/checkpoint_last.pt does not"),
    (["train", "--resume", TSP_MODEL], "is a tsp-model checkpoint"),
    (["train", "--compile", "reduce-overhead", "--device", "cpu"],
     "--compile: reduce-overhead is GPU only, as it replays CUDA graphs, and the device is cpu; on a CPU give off"),
    (["train", "--task", "documents", "--compile", "reduce-overhead", "--device", "cpu"],
     "--compile: reduce-overhead is GPU only"),
    (["train", "--task", "books"], "--task: invalid choice: 'books'"),
    (["train", "--task", "documents", "--packing", "zipped"], "--packing: invalid choice: 'zipped'"),
    (["train", "--task", "documents", "--max-len", "1"], "--max-len: 1 is out of range; give a value ≥ 2"),
    (["train", "--task", "documents", "--mean-fraction", "0"], "--mean-fraction: 0.0 is out of range"),
    (["train", "--task", "documents", "--max-period", "1"], "--max-period: 1 is out of range"),
    (["train", "--task", "documents", "--num-pairs", "4"], "--num-pairs: is not a setting of --task documents"),
    (["train", "--packing", "padded"], "--packing: is not a setting of --task recall"),
    (["train", "--task", "documents", "--attention", "flashlab", "--dropout", "0.1"],
     "--dropout: 0.1 with packing=packed and attention=flashlab: varlen_attention has no dropout"),
    (["train-tsp", "--epoch-steps", "0"], "--epoch-steps: 0 is out of range"),
    (["train-tsp", "--eval-instances", "1"], "--eval-instances: 1 is out of range; give a value ≥ 2"),
    (["train-tsp", "--eval-instances", "0"], "--eval-instances: 0 is out of range"),
    (["train-tsp", "--n-nodes", "2"], "--n-nodes: 2 is out of range; give a value ≥ 3"),
    (["train-tsp", "--alpha", "1.5"], "--alpha: 1.5 is out of range; give a value in (0, 1)"),
    (["train-tsp", "--tanh-clip", "0"], "--tanh-clip: 0.0 is out of range"),
    (["train-tsp", "--rollout-batch", "0"], "--rollout-batch: 0 is out of range"),
    (["train-tsp", "--seq-len", "32"], "unrecognized arguments: --seq-len"),          # no flag that does nothing
    (["train-tsp", "--resume", TSP_STATE, "--attention", "sdpa", "--n-nodes", "20"],
     "--resume: " + TSP_STATE + " comes from a different run: n_nodes is 20 but the checkpoint has 50"),
    (["train-tsp", "--resume", LM_MODEL], "is an lm-model checkpoint"),
    (["train-tsp", "--compile", "reduce-overhead", "--device", "cpu"],
     "--compile: reduce-overhead is GPU only, as it replays CUDA graphs, and the device is cpu; on a CPU give off"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--instances", "0"], "--instances: 0 is out of range"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--instances", "-5"], "--instances: -5 is out of range"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--nodes", "0"], "--nodes: 0 is out of range; give a value ≥ 3"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--nodes", "-3"], "--nodes: -3 is out of range"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--nodes", "1"], "--nodes: 1 is out of range"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--seed", "-1"], "--seed: -1 is out of range"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--attention", "fast"], "--attention: invalid choice"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--save-tours", "/nonexistent-dir/tours.npz"],
     "--save-tours: the directory /nonexistent-dir does not exist"),
    (["eval-tsp", "--checkpoint", "/nonexistent.pt"], "--checkpoint: /nonexistent.pt does not exist"),
    (["eval-tsp", "--checkpoint", TSP_STATE], "--checkpoint: " + TSP_STATE + " is a tsp-training-state checkpoint"),
    (["eval-tsp", "--checkpoint", str(ROOT / "LICENSE")],
     "--checkpoint: " + str(ROOT / "LICENSE") + " is not a PyTorch checkpoint (not a torch.save zip archive"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--device", "cuda"],      # the command's own parser says it
     "python -m flashlab eval-tsp: error: unrecognized arguments: --device cuda (see python -m flashlab eval-tsp "
     "--help)"),
    (["eval-tsp"], "the following arguments are required: --checkpoint"),
    (["export-tsp", "--checkpoint", TSP_MODEL, "--out", "/nonexistent-dir/am.pt"],
     "--out: the directory /nonexistent-dir does not exist"),
    (["export-tsp", "--checkpoint", "/nonexistent.pt", "--out", "am.pt"],
     "--checkpoint: /nonexistent.pt does not exist"),
    (["export-tsp", "--checkpoint", TSP_MODEL, "--out", "/tmp/flashlab-export-test.pt"],
     "--checkpoint: " + TSP_MODEL + " is a tsp-model checkpoint"),
    # batches come from seed·1,000,003 + step, a 64-bit generator seed: a larger seed was a traceback
    (["train", "--seed", "99999999999999999999999"],
     "--seed: 99999999999999999999999 is out of range; give a value in [0, 2147483647]"),
    (["train-tsp", "--seed", "2147483648"], "--seed: 2147483648 is out of range; give a value in [0, 2147483647]"),
    ([], "the following arguments are required: command"),
    (["trian"], "invalid choice: 'trian'"),
    (["train", "--n-head", "4"], "train: error: unrecognized arguments: --n-head"),    # no abbreviations
]
# Found by an audit (runs on a shared machine): an empty --out-dir trained and saved nothing without a word;
# impossible sizes ended in allocator tracebacks, or in the kernel's out-of-memory kill after a minute. Now
# each is one line, sizes with the memory they would need; and the table reaches every command's options.
CPU = ["--device", "cpu"]
BAD += [
    (["train", "--out-dir", ""], "--out-dir: '' is an empty path; give a directory"),
    (["train", "--resume", ""], "--resume: an empty path; give the path of a checkpoint"),
    (["train", "--resume", "auto"], "--resume: auto resumes the newest complete checkpoint in --out-dir; add"),
    (["train", "--resume", str(ROOT)], f"--resume: {ROOT} does not exist or is not a file"),
    (["train", *CPU, "--seq-len", "100000000"], "--seq-len: 100000000 needs at least "),
    (["train", *CPU, "--d-model", "100000000"], "--d-model: 100000000 needs at least "),
    (["train", *CPU, "--n-layers", "100000000"], "--n-layers: 100000000 needs at least "),
    (["train", *CPU, "--vocab-size", "10000000000"], "--vocab-size: 10000000000 needs at least "),
    (["train", *CPU, "--batch-size", "10000000000"], "--batch-size: 10000000000 needs at least "),
    (["train", *CPU, "--seq-len", "400000000", "--num-pairs", "100000000", "--vocab-size", "200000000"],
     "--seq-len: 400000000 needs at least "),
    (["train", *CPU, "--task", "documents", "--max-len", "1000000000"], "--max-len: 1000000000 needs at least "),
    (["train", "--task", "documents", "--max-period", "100"], "--max-period: 100 is longer than max_len=64"),
    (["train", "--task", "documents", "--max-len", "0"], "--max-len: 0 is out of range"),
    (["train", "--task", "documents", "--mean-fraction", "1.5"], "--mean-fraction: 1.5 is out of range"),
    (["train", "--keep-checkpoints", "2"], "--keep-checkpoints: it prunes the checkpoint_<step>.pt files"),
    (["train", "--lr", "1e400"], "--lr: inf is not a finite number"),
    (["train", "--lr", "abc"], "--lr: 'abc' is not a number"),
    (["train", "--weight-decay", "-1"], "--weight-decay: -1.0 is out of range"),
    (["train", "--weight-decay", "nan"], "--weight-decay: nan is not a finite number"),
    (["train", "--warmup-steps", "-1"], "--warmup-steps: -1 is out of range"),
    (["train", "--grad-clip", "-0.5"], "--grad-clip: -0.5 is out of range"),
    (["train", "--checkpoint-every", "-1"], "--checkpoint-every: -1 is out of range"),
    (["train", "--keep-checkpoints", "-1"], "--keep-checkpoints: -1 is out of range"),
    (["train", "--seed", "-1"], "--seed: -1 is out of range"),
    (["train", "--vocab-size", "1"], "--vocab-size: 1 is out of range"),
    (["train", "--seq-len", "1"], "--seq-len: 1 is out of range"),
    (["train", "--n-layers", "0"], "--n-layers: 0 is out of range"),
    (["train", "--rotary-fraction", "1.5"], "--rotary-fraction: 1.5 is out of range"),
    (["train", "--query-rate", "2"], "--query-rate: 2.0 is out of range"),
    (["train", "--dropout", "-0.1"], "--dropout: -0.1 is out of range"),
    (["train", "--compile", "max"], "--compile: invalid choice: 'max'"),
    (["train", "--precision", "bf16"], "--precision: invalid choice: 'bf16'"),
    (["train", "--steps"], "--steps: expected one argument"),
    (["train", "--steps", "1.5"], "--steps: '1.5' is not an integer"),
    (["train", "--time-limit-min", "nan"], "--time-limit-min: nan is not a finite number"),
    (["train", "--max-bad-steps", "x"], "--max-bad-steps: 'x' is not an integer"),
    (["train", "--out-dir", "/proc/flashlab-forbidden", "--resume", "auto"],
     "--out-dir: cannot write to /proc/flashlab-forbidden"),
    (["train-tsp", "--out-dir", ""], "--out-dir: '' is an empty path"),
    (["train-tsp", "--resume", ""], "--resume: an empty path"),
    (["train-tsp", "--resume", "auto"], "--resume: auto resumes the newest complete checkpoint in --out-dir"),
    (["train-tsp", *CPU, "--n-nodes", "100000000"], "--n-nodes: 100000000 needs at least "),
    (["train-tsp", *CPU, "--n-layers", "100000000"], "--n-layers: 100000000 needs at least "),
    (["train-tsp", *CPU, "--epoch-steps", "100000000"], "--epoch-steps: 100000000 needs at least "),
    (["train-tsp", *CPU, "--eval-instances", "100000000000"], "--eval-instances: 100000000000 needs at least "),
    (["train-tsp", "--ff-dim", "0"], "--ff-dim: 0 is out of range"),
    (["train-tsp", "--d-model", "0"], "--d-model: 0 is out of range"),
    (["train-tsp", "--n-heads", "3"], "--n-heads: 3 does not divide d_model=128"),
    (["train-tsp", "--alpha", "0"], "--alpha: 0.0 is out of range"),
    (["train-tsp", "--tanh-clip", "inf"], "--tanh-clip: inf is not a finite number"),
    (["train-tsp", "--batch-size", "6", "--grad-accum", "4"], "--batch-size: 6 is not divisible by grad_accum"),
    (["train-tsp", "--epoch-steps", "-1"], "--epoch-steps: -1 is out of range"),
    (["train-tsp", "--keep-checkpoints", "3"], "--keep-checkpoints: it prunes the checkpoint_<step>.pt files"),
    (["eval-tsp", "--checkpoint", ""], "--checkpoint: an empty path"),
    (["eval-tsp", "--checkpoint", str(ROOT)], f"--checkpoint: {ROOT} does not exist or is not a file"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--save-tours", ""], "--save-tours: an empty path; give a file name"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--save-tours", str(ROOT)], f"--save-tours: {ROOT} is a directory"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--nodes", "100000000"], "--nodes: 100000000 needs at least "),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--instances", "100000000000"],
     "--instances: 100000000000 needs at least "),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--instances", "abc"], "--instances: 'abc' is not an integer"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--seed", str(2**64)], f"--seed: {2**64} is out of range"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--nodes", "abc"], "--nodes: 'abc' is not an integer"),
    (["export-tsp", "--checkpoint", TSP_STATE, "--out", ""], "--out: an empty path; give a file name"),
    (["export-tsp", "--checkpoint", "", "--out", "am.pt"], "--checkpoint: an empty path"),
    (["export-tsp", "--checkpoint", TSP_STATE, "--out", str(ROOT)], f"--out: {ROOT} is a directory"),
    (["export-tsp", "--checkpoint", TSP_STATE], "the following arguments are required: --out"),
    (["export-tsp", "--out", "am.pt"], "the following arguments are required: --checkpoint"),
    (["bench-softmax", "--cols", "0"], "--cols: 0 is out of range"),
    (["bench-softmax", "--rows", "-1"], "--rows: -1 is out of range"),
    (["bench-softmax", "--out", ""], "--out: an empty path; give a file name"),
    (["bench-softmax", "--dtype", "int8"], "--dtype: invalid choice: 'int8'"),
    (["bench", "--seq-lens", "abc"], "--seq-lens: 'abc' is not an integer"),
    (["bench", "--out", ""], "--out: an empty path; give a file name"),
    (["bench", "--head-dims", "0"], "--head-dims: 0 is out of range"),
    (["tune", "--shape", "1,2,3"], "--shape: '1,2,3' is not B,H,N,D or B,H,N,D,H_kv"),
    (["tune", "--shape", "1,2,0,4"], "--shape: '1,2,0,4' is not B,H,N,D or B,H,N,D,H_kv"),
    (["tune"], "the following arguments are required: --shape"),
    (["tune", "--shape", "1,2,3,4", "--dtype", "fp8"], "--dtype: invalid choice: 'fp8'"),
    (["tune", "--shape", "1,2,3,4", "--causal", "maybe"], "--causal: invalid choice: 'maybe'"),
]
if NO_GPU:
    BAD.append((["tune", "--shape", "1,2,3,4"], "no CUDA GPU: tuning times the compiled kernels"))
    BAD.append((["train", "--device", "cuda"], "--device: cuda was asked for but no CUDA GPU is visible"))
    BAD.append((["train-tsp", "--device", "cuda"], "--device: cuda was asked for but no CUDA GPU is visible"))
    for command in ("train", "train-tsp"):              # --device auto, which finds no GPU
        BAD.append(([command, "--compile", "reduce-overhead"], "--compile: reduce-overhead is GPU only, as it "
                                                               "replays CUDA graphs, and no GPU was found"))


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exit_:                         # argparse's own errors
        code = exit_.code
    return code, capsys.readouterr()


@pytest.mark.parametrize("argv,expected", BAD, ids=[" ".join(a)[:60] or "(none)" for a, _ in BAD])
def test_a_bad_argument_ends_in_one_line_that_names_it(argv, expected, capsys):
    code, captured = _run(argv, capsys)
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, captured.err
    assert expected in lines[0] and "Traceback" not in captured.err, lines[0]
    assert lines[0].startswith("python -m flashlab") and ": error: " in lines[0]
    assert captured.out == ""                           # nothing ran


def test_the_table_covers_every_command():
    assert len(BAD) >= 100
    assert {c.name for c in COMMANDS} | {"tune"} <= {a[0] for a, _ in BAD if a}


def test_help_lists_every_option_with_a_line_and_every_choice():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, sub in subparsers.choices.items():
        text = " ".join(sub.format_help().split())
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings} has no help line"
            for choice in action.choices or ():
                assert str(choice) in text
    train_help = " ".join(subparsers.choices["train"].format_help().split())
    assert "auto: flashlab on a GPU" in train_help and "sdpa on a CPU" in train_help
    assert "0 = never stop" in train_help                                     # --max-bad-steps, one meaning


@pytest.mark.parametrize("argv,expected", [
    (["train", "--device", "cuda"] if NO_GPU else ["train", "--grad-accum", "0"],
     "--device: cuda was asked for" if NO_GPU else "--grad-accum: 0"),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--instances", "0"], "--instances: 0 is out of range"),
])
def test_a_bad_argument_from_the_shell(argv, expected):
    result = subprocess.run([sys.executable, "-m", "flashlab", *argv], capture_output=True, text=True, timeout=300,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and expected in result.stderr, result.stderr


def test_resume_on_the_command_line_takes_the_checkpoints_settings_unless_given(tmp_path, capsys):
    """The model and task flags need not be repeated on resume; a given one that differs is
    refused, with every mismatch in the line."""
    out = str(tmp_path)
    common = ["--device", "cpu", "--attention", "sdpa", "--no-progress", "--batch-size", "4", "--out-dir", out]
    assert main(["train", "--seq-len", "16", "--num-pairs", "2", "--vocab-size", "16", "--d-model", "16",
                 "--n-heads", "2", "--n-layers", "1", "--steps", "2", *common]) == 0
    last = str(tmp_path / "checkpoint_last.pt")
    assert main(["train", "--resume", last, "--steps", "3", *common]) == 0
    assert "steps 3, skipped 0" in capsys.readouterr().out
    code, captured = _run(["train", "--resume", last, "--steps", "4", "--n-heads", "4", "--seed", "1", *common],
                          capsys)
    assert code == 2 and captured.err.count("\n") == 1
    assert "--resume: " in captured.err and "n_heads is 4 but the checkpoint has 2; seed is 1" in captured.err


def test_resume_continues_with_the_checkpoints_run_settings(tmp_path, capsys):
    """Found by a user trial: resuming without repeating --batch-size/--lr/--warmup-steps used to
    reset them to the defaults silently. Now every setting not given is the checkpoint's, a given
    free one overrides it (said in one line), and --steps at or below the checkpoint's step is a
    one-line error rather than a run that trains nothing."""
    from flashlab.train import checkpoint

    out = str(tmp_path)
    first = ["train", "--seq-len", "16", "--num-pairs", "2", "--vocab-size", "16", "--d-model", "16", "--n-heads", "2",
             "--n-layers", "1", "--device", "cpu", "--attention", "sdpa", "--no-progress", "--batch-size", "4",
             "--lr", "0.001", "--warmup-steps", "2", "--steps", "2", "--out-dir", out]
    assert main(first) == 0
    last = str(tmp_path / "checkpoint_last.pt")
    capsys.readouterr()
    assert main(["train", "--resume", last, "--steps", "3", "--no-progress"]) == 0
    assert "changed from the checkpoint" not in capsys.readouterr().out
    stored = checkpoint.load(last).config["run"]
    assert (stored["batch_size"], stored["lr"], stored["warmup_steps"], stored["steps"]) == (4, 0.001, 2, 3)
    assert main(["train", "--resume", last, "--steps", "4", "--lr", "0.002", "--no-progress"]) == 0
    assert "resume: changed from the checkpoint: lr 0.001 → 0.002" in capsys.readouterr().out
    assert checkpoint.load(last).config["run"]["batch_size"] == 4
    code, captured = _run(["train", "--resume", last, "--steps", "4"], capsys)
    assert code == 2 and captured.err.count("\n") == 1
    assert "--steps: the checkpoint is at step 4 already" in captured.err


TINY_LM = ["train", "--seq-len", "16", "--num-pairs", "2", "--vocab-size", "16", "--d-model", "16", "--n-heads", "2",
           "--n-layers", "1", "--device", "cpu", "--attention", "sdpa", "--no-progress", "--batch-size", "4"]


def test_where_a_run_writes_is_said_and_a_run_is_never_overwritten_silently(tmp_path, capsys):
    """Found by a practitioner's trial, three ways to lose or mix training output without a word:
    a new run into a directory that holds a run (now refused, nothing touched); a copied
    checkpoint resumed without --out-dir, which wrote into the original run's directory (now
    refused, naming both choices); an earlier checkpoint resumed into its run, which cut the run
    back silently (now said). Without --out-dir nothing is saved, and that is said too."""
    import shutil

    from flashlab.train import checkpoint
    run, copy = tmp_path / "run", tmp_path / "copy"
    assert main([*TINY_LM, "--steps", "4", "--checkpoint-every", "2", "--out-dir", str(run)]) == 0
    capsys.readouterr()
    before = (run / "metrics.csv").read_text()
    code, captured = _run([*TINY_LM, "--steps", "2", "--out-dir", str(run)], capsys)
    assert code == 2 and captured.err.count("\n") == 1
    assert f"--out-dir: {run} holds a run already (checkpoint_last.pt); continue it with --resume" in captured.err
    assert (run / "metrics.csv").read_text() == before

    stopped = tmp_path / "stopped"             # a run stopped before its first checkpoint: no resume to suggest
    stopped.mkdir()
    (stopped / "metrics.csv").write_text(before)
    code, captured = _run([*TINY_LM, "--steps", "2", "--out-dir", str(stopped)], capsys)
    assert code == 2 and captured.err.count("\n") == 1 and "--resume" not in captured.err, captured.err
    assert f"--out-dir: {stopped} holds a run already (metrics.csv, no checkpoint to resume from)" in captured.err

    shutil.copytree(run, copy)
    code, captured = _run(["train", "--resume", str(copy / "checkpoint_2.pt"), "--steps", "5", "--no-progress"],
                          capsys)
    assert code == 2 and captured.err.count("\n") == 1
    assert f"was saved by the run in {run}" in captured.err and f"give --out-dir {copy}" in captured.err
    assert main(["train", "--resume", str(copy / "checkpoint_2.pt"), "--steps", "5", "--no-progress",
                 "--out-dir", str(copy)]) == 0
    said = capsys.readouterr().out
    assert f"resume: from step 2, writing to {copy}" in said
    assert f"resume: {copy} had reached step 4; from here its metrics.csv is cut back to step 2" in said
    assert (run / "metrics.csv").read_text() == before                     # the original run untouched
    assert checkpoint.load(run / "checkpoint_last.pt").state["step"] == 4
    assert checkpoint.load(copy / "checkpoint_last.pt").state["step"] == 5

    assert main([*TINY_LM, "--steps", "1"]) == 0
    assert "no --out-dir: nothing of this run is saved" in capsys.readouterr().out
    code, captured = _run([*TINY_LM, "--steps", "1", "--checkpoint-every", "1"], capsys)
    assert code == 2 and "--checkpoint-every: checkpoints need a directory; add --out-dir DIR." in captured.err

    # another command's checkpoint: said first, not a complaint about --steps
    code, captured = _run(["train-tsp", "--resume", str(run / "checkpoint_last.pt")], capsys)
    assert code == 2 and "lm-training-state" in captured.err and "tsp-training-state" in captured.err
    assert "--steps" not in captured.err


def test_eval_tsp_takes_the_checkpoints_city_count(capsys):
    """eval-tsp used to evaluate every checkpoint on TSP20 unless --nodes was given (the shipped
    TSP50 model was reported on 20 cities); now the default is the count it was trained on."""
    tsp50 = str(CHECKPOINTS / "am_tsp50.pt")
    assert main(["eval-tsp", "--checkpoint", tsp50, "--instances", "4", "--attention", "sdpa"]) == 0
    assert "TSP50, 4 instances" in capsys.readouterr().out
    assert main(["eval-tsp", "--checkpoint", tsp50, "--instances", "4", "--attention", "sdpa", "--nodes", "20"]) == 0
    said = capsys.readouterr().out
    assert "TSP20, 4 instances" in said and "(trained on TSP50, evaluated on TSP20)" in said


TINY_TSP = ["train-tsp", "--n-nodes", "5", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--ff-dim", "32",
            "--epoch-steps", "3", "--eval-instances", "8", "--rollout-batch", "16", "--batch-size", "4",
            "--attention", "sdpa", "--device", "cpu", "--no-progress"]


def test_a_stopped_tsp_run_exports_its_policy_and_a_spent_time_limit_is_said(tmp_path, capsys, monkeypatch):
    """SIGTERM mid-run (here sent by the run to itself after its second step): the run stops between
    steps, saves, exports am_tsp5.pt (eval-tsp loads it) and exits 128 + 15, saying so at once and when
    it stops. A resumed run whose time limit is spent says so instead of ending silently."""
    import os
    import signal

    from flashlab.train.tsp_train import TSPTrainer
    original = TSPTrainer.on_step_end

    def stop_after_two(self, metrics):
        original(self, metrics)
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(TSPTrainer, "on_step_end", stop_after_two)
    out = tmp_path / "tsp"
    code, captured = _run([*TINY_TSP, "--steps", "50", "--out-dir", str(out)], capsys)
    # two lines: the signal acknowledged at once (a step or a baseline rollout may take minutes), then the stop
    assert code == 128 + signal.SIGTERM.value and captured.err.count("\n") == 2, captured.err
    assert captured.err.startswith("SIGTERM: stopping after the current step, then saving a checkpoint")
    assert "stopped by SIGTERM after step 2: saved" in captured.err
    assert main(["eval-tsp", "--checkpoint", str(out / "am_tsp5.pt"), "--instances", "4", "--attention", "sdpa"]) == 0
    assert "TSP5, 4 instances" in capsys.readouterr().out
    monkeypatch.setattr(TSPTrainer, "on_step_end", original)

    timed = tmp_path / "timed"                      # a limit one step outruns, then a resume past it
    assert main([*TINY_TSP, "--steps", "50", "--out-dir", str(timed), "--time-limit-min", "0.000001"]) == 0
    capsys.readouterr()
    assert main(["train-tsp", "--resume", str(timed / "checkpoint_last.pt"), "--steps", "60", "--no-progress"]) == 0
    assert "resume: the time limit is reached already" in capsys.readouterr().out


def test_a_second_sigterm_stops_the_step_at_once_without_saving(tmp_path, capsys, monkeypatch):
    """A first SIGTERM waits for the step; a second one (an impatient `kill`, a scheduler's reminder)
    cuts it where it is: exit 128 + 15, said in one line, and no checkpoint of a half-done step."""
    import os
    import signal

    from flashlab.train.tsp_train import TSPTrainer
    original, steps_after_the_second = TSPTrainer.on_step_end, []

    def signal_twice(self, metrics):       # both inside step 2, before the loop looks at the first
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            steps_after_the_second.append(self.step)      # not reached: the second signal raised
        original(self, metrics)
    monkeypatch.setattr(TSPTrainer, "on_step_end", signal_twice)
    out = tmp_path / "tsp"
    code, captured = _run([*TINY_TSP, "--steps", "50", "--out-dir", str(out)], capsys)
    assert code == 128 + signal.SIGTERM.value and steps_after_the_second == [], captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("SIGTERM: stopping after the current step"), captured.err
    assert lines[1].endswith("stopped at once by a second SIGTERM, mid-step: nothing saved (this run had written "
                             "no checkpoint yet)"), lines[1]
    assert not (out / "checkpoint_last.pt").exists() and not (out / "am_tsp5.pt").exists()

    # with a checkpoint every step, the line names the one a resume starts from (the last written before)
    saved = tmp_path / "saved"
    code, captured = _run([*TINY_TSP, "--steps", "50", "--out-dir", str(saved), "--checkpoint-every", "1"], capsys)
    last = saved / "checkpoint_last.pt"
    assert code == 128 + signal.SIGTERM.value
    assert captured.err.splitlines()[1].endswith(f"nothing saved since {last}; continue with --resume {last}")


def test_tune_is_listed_with_the_commands():
    choices = build_parser()._subparsers._group_actions[0].choices
    assert "tune" in choices and "train-tsp" in choices


def test_export_tsp_writes_the_policy_of_a_training_state(tmp_path, capsys):
    """A run killed before its own export left only checkpoints, and no command turned one into
    the am_tspN.pt eval-tsp loads; export-tsp does (any checkpoint_<step>.pt too)."""
    out = tmp_path / "run"
    assert main([*TINY_TSP, "--steps", "4", "--checkpoint-every", "2", "--out-dir", str(out)]) == 0
    capsys.readouterr()
    policy = tmp_path / "am_step2.pt"
    assert main(["export-tsp", "--checkpoint", str(out / "checkpoint_2.pt"), "--out", str(policy)]) == 0
    assert "the TSP5 policy at step 2" in capsys.readouterr().out
    assert main(["eval-tsp", "--checkpoint", str(policy), "--instances", "4", "--attention", "sdpa"]) == 0
    said = capsys.readouterr().out
    assert "TSP5, 4 instances" in said and "steps=2" in said
    code, captured = _run(["export-tsp", "--checkpoint", str(policy), "--out", str(tmp_path / "x.pt")], capsys)
    assert code == 2 and captured.err.count("\n") == 1 and "--checkpoint: " in captured.err
    assert "tsp-training-state" in captured.err


def test_an_existing_output_file_is_replaced_only_with_overwrite(tmp_path, capsys):
    """A practitioner's trial: export-tsp --out given its own --checkpoint replaced the run's
    training state with the policy (resume then refused it), and eval-tsp --save-tours README.md
    wrote a zip over the README. An existing file is now refused in one line, untouched, unless
    --overwrite is given; the file a command reads is refused even then."""
    import shutil

    from flashlab.train import checkpoint
    from flashlab.train.tsp import load_tours
    state = tmp_path / "state.pt"
    shutil.copyfile(TSP_STATE, state)
    mine = tmp_path / "mine.txt"
    mine.write_text("mine")
    for argv, option in (
            (["eval-tsp", "--checkpoint", TSP_MODEL, "--instances", "4", "--attention", "sdpa", "--save-tours",
              str(mine)], "--save-tours"),
            (["export-tsp", "--checkpoint", str(state), "--out", str(mine)], "--out"),
            (["bench-softmax", "--rows", "4", "--cols", "8", "--out", str(mine)], "--out")):
        code, captured = _run(argv, capsys)
        assert code == 2 and captured.err.count("\n") == 1, captured.err
        assert captured.err.endswith(f"{option}: {mine} exists already; give a new file name, or add --overwrite to "
                                     f"replace it.\n"), captured.err
        assert mine.read_text() == "mine"
    for flags in ([], ["--overwrite"]):
        code, captured = _run(["export-tsp", "--checkpoint", str(state), "--out", str(state), *flags], capsys)
        assert code == 2 and f"--out: {state} is the file --checkpoint reads" in captured.err, captured.err
    assert checkpoint.load(state).kind == "tsp-training-state"
    assert main(["eval-tsp", "--checkpoint", TSP_MODEL, "--instances", "4", "--attention", "sdpa", "--save-tours",
                 str(mine), "--overwrite"]) == 0
    assert load_tours(mine)["tours"].shape == (4, 20)
    assert not list(tmp_path.glob(".*.tmp"))                    # written through a temporary file, renamed


def test_keep_checkpoints_prunes_the_oldest(tmp_path, capsys):
    """--checkpoint-every 1 used to leave a file per step (a practitioner's run: 1029); with
    --keep-checkpoints N only the newest N checkpoint_<step>.pt stay, beside checkpoint_last.pt."""
    out = tmp_path / "run"
    assert main([*TINY_LM, "--steps", "7", "--checkpoint-every", "1", "--keep-checkpoints", "3",
                 "--out-dir", str(out)]) == 0
    assert sorted(p.name for p in out.glob("checkpoint_*.pt")) == [
        "checkpoint_5.pt", "checkpoint_6.pt", "checkpoint_7.pt", "checkpoint_last.pt"]
    stale = out / ".checkpoint_6.pt.k1ll3d.tmp"     # what a kill mid-save leaves; no later save has that name
    stale.write_bytes(b"half a checkpoint")
    assert main(["train", "--resume", str(out / "checkpoint_5.pt"), "--steps", "9", "--no-progress"]) == 0
    assert sorted(p.name for p in out.glob("checkpoint_*.pt")) == [       # the setting came with the checkpoint
        "checkpoint_7.pt", "checkpoint_8.pt", "checkpoint_9.pt", "checkpoint_last.pt"]
    assert not stale.exists()                        # removed when the resumed run started


def test_a_refused_run_leaves_no_directory_behind(tmp_path, capsys):
    """A learner trial: a resume refused for a node-count mismatch left its new --out-dir behind,
    empty, although every option is checked before any work starts. The directory is made when
    the run starts; one that cannot be made is still refused first."""
    out = tmp_path / "runs" / "x"
    code, captured = _run(["train-tsp", "--n-nodes", "20", "--resume", TSP_STATE, "--steps", "23600", "--out-dir",
                           str(out)], capsys)
    assert code == 2 and "n_nodes is 20 but the checkpoint has 50" in captured.err, captured.err
    assert not (tmp_path / "runs").exists()
    run = tmp_path / "lm"
    assert main([*TINY_LM, "--steps", "1", "--out-dir", str(run)]) == 0
    assert (run / "checkpoint_last.pt").exists()                          # made by a run that starts
    code, captured = _run(["train", "--resume", str(run / "checkpoint_last.pt"), "--steps", "2", "--n-heads", "4",
                           "--out-dir", str(out)], capsys)
    assert code == 2 and "n_heads is 4 but the checkpoint has 2" in captured.err, captured.err
    assert not (tmp_path / "runs").exists()
    code, captured = _run([*TINY_LM, "--steps", "1", "--out-dir", str(run / "metrics.csv" / "sub")], capsys)
    assert code == 2 and f"--out-dir: cannot write to {run / 'metrics.csv' / 'sub'}" in captured.err, captured.err


def test_a_gpu_runs_cuda_graphs_are_not_taken_on_a_cpu_resume(tmp_path, capsys):
    """--compile reduce-overhead is GPU only: resuming such a run on a CPU (the shipped TSP50
    state) takes the machine's setting, as for --device, and says so; so does attention flashlab,
    whose kernels a CPU runs in Triton's interpreter (a practitioner's resume of the shipped TSP50
    state finished no step in 8.5 minutes). export-tsp rebuilds it on the CPU and records how
    the run was compiled."""
    from flashlab.train import checkpoint
    from flashlab.train.tsp import load_model

    out = tmp_path / "run"
    assert main([*TINY_TSP, "--steps", "2", "--out-dir", str(out)]) == 0
    last = out / "checkpoint_last.pt"
    saved = checkpoint.load(last)                   # as if trained on a GPU with CUDA graphs and the kernels
    assert saved.metadata == {"device": "cpu"}
    saved.config["run"]["compile"] = "reduce-overhead"
    saved.config["task"]["attention"] = "flashlab"
    saved.metadata["device"] = "cuda"
    checkpoint.save(last, saved.kind, saved.config, saved.state, saved.metadata)
    capsys.readouterr()
    assert main(["train-tsp", "--resume", str(last), "--steps", "3", "--device", "cpu", "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert ("resume: changed from the checkpoint: attention flashlab → auto (sdpa here), as the device is cpu and "
            "flashlab's kernels would run in Triton's interpreter; give --attention flashlab to keep them; "
            "compile reduce-overhead → off, as reduce-overhead replays CUDA graphs and the device is cpu") in said
    assert "steps 3," in said and "compiled" not in said, said
    assert checkpoint.load(last).config["task"]["attention"] == "sdpa"
    # given on the command line, the kernels stay (interpreted: one step of TSP5)
    assert main(["train-tsp", "--resume", str(last), "--steps", "4", "--device", "cpu", "--no-progress",
                 "--attention", "flashlab"]) == 0
    assert capsys.readouterr().out.startswith("resume: changed from the checkpoint: attention sdpa → flashlab\n")
    assert checkpoint.load(last).config["task"]["attention"] == "flashlab"
    saved.config["run"]["compile"] = "reduce-overhead"
    checkpoint.save(last, saved.kind, saved.config, saved.state, saved.metadata)
    assert main(["export-tsp", "--checkpoint", str(last), "--out", str(tmp_path / "am.pt")]) == 0
    assert load_model(tmp_path / "am.pt")[1]["compile"] == "reduce-overhead"


@pytest.mark.parametrize("recorded", [True, False])
def test_a_cpu_run_with_flashlab_attention_keeps_it_on_resume(recorded, tmp_path, capsys):
    """A practitioner's trial: train --attention flashlab on a CPU, stopped, then --resume: the resume switched
    to sdpa ("as no GPU was found"), a rule meant for a GPU run's kernels, though flashlab had been chosen for
    this CPU run. A checkpoint records the device it trained on; one written before that (``recorded``
    False) tells by its CUDA RNG state, None where no GPU was there."""
    from flashlab.train import checkpoint

    out = tmp_path / "run"
    assert main([*TINY_TSP, "--steps", "1", "--attention", "flashlab", "--device", "cpu", "--out-dir", str(out)]) == 0
    last = out / "checkpoint_last.pt"
    if not recorded:
        saved = checkpoint.load(last)
        checkpoint.save(last, saved.kind, saved.config, saved.state)      # no metadata, as before 2026-12-07
    capsys.readouterr()
    assert main(["train-tsp", "--resume", str(last), "--steps", "2", "--device", "cpu", "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "attention" not in said.split("\n")[0], said
    assert checkpoint.load(last).config["task"]["attention"] == "flashlab"


@pytest.mark.parametrize("gpu", [False, True])
def test_benchmarks_take_sizes_that_fit_the_machine(gpu, monkeypatch, capsys):
    """bench and bench-softmax's sizes are a GPU's: on a CPU, where the kernels run in Triton's
    interpreter, bench's defaults ran past 2 minutes on their first of 48 rows and bench-softmax's
    took minutes (a practitioner's trial). On a CPU the sizes not given are small ones, said in one
    line; on a GPU and where given, they are as before."""
    from flashlab import cli
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    parser = build_parser()
    softmax = parser.parse_args(["bench-softmax"])
    cli._sizes_for_this_machine("bench-softmax", softmax)
    bench = parser.parse_args(["bench", "--heads", "4"])
    cli._sizes_for_this_machine("bench", bench)
    said = capsys.readouterr().err
    if gpu:
        assert softmax.rows == 4096 and bench.seq_lens == [512, 1024, 2048, 4096, 8192, 16384]
        assert bench.tokens == 16384 and bench.dtypes == ["bfloat16", "float16"] and said == ""
    else:
        assert softmax.rows == 256 and bench.seq_lens == [64, 128] and bench.tokens == 256
        assert bench.dtypes == ["bfloat16"] and bench.head_dims == [64]
        lines = said.splitlines()
        assert len(lines) == 2 and "no GPU" in lines[0] and "--rows 256" in lines[0]
        assert "--seq-lens 64 128" in lines[1] and "--heads" not in lines[1]
    assert bench.heads == 4, "a size given on the command line is kept"
