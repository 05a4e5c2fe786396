"""SIGKILL a real training process at every moment of its checkpoint save, again and again,
and resume each time: a kill never leaves a checkpoint that cannot be resumed, and the
finished run's metrics.csv has each step once, with the losses of an uninterrupted run.

Each training process runs ``python -m flashlab train``'s own ``main``; the only change is
that the checkpoint module's file writes, fsyncs and rename announce themselves on stdout
and wait for the parent's go-ahead on stdin, so the parent can kill at an exact moment of a
save. The processes are forked from one server that imported torch once, to keep the loop
cheap (about a training step per kill)."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flashlab.train import checkpoint

ROOT = Path(__file__).resolve().parents[2]

SERVER = r"""
import json, os, sys, types
import flashlab.train.checkpoint as ck
from flashlab.cli import main          # torch and flashlab imported once, before any fork
import flashlab.train.documents, tqdm.auto   # and what main imports as it runs (3 s of each child's CPU)

def announce(event):
    print("EVENT", event, flush=True)
    if not sys.stdin.readline():            # the parent closed stdin: stop waiting
        os._exit(3)

class AnnouncingFile:
    def __init__(self, f):
        self.f = f
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.f.close()
    def write(self, data):
        announce("write")
        return self.f.write(data)
    def __getattr__(self, name):
        return getattr(self.f, name)

def announcing_open(*args, **kwargs):
    announce("open")
    return AnnouncingFile(open(*args, **kwargs))

def fsync(fd):
    announce("fsync")
    os.fsync(fd)

def replace(a, b):
    announce("replace")
    os.replace(a, b)

proxy = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
proxy.fsync, proxy.replace = fsync, replace
ck.os, ck.open, ck.WRITE_CHUNK = proxy, announcing_open, 8192
original_write_atomically = ck.write_atomically

def write_atomically(path, data):           # which file the next events write
    print("TARGET", os.path.basename(path), flush=True)
    return original_write_atomically(path, data)

ck.write_atomically = write_atomically
for line in sys.stdin:                      # one training process per line: its arguments as JSON
    pid = os.fork()
    if pid == 0:
        print("PID", os.getpid(), flush=True)
        code = main(json.loads(line))
        sys.stdout.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("EXIT", os.waitstatus_to_exitcode(status), flush=True)
"""

STEPS = 30
ARGS = ["train", "--seq-len", "16", "--num-pairs", "2", "--vocab-size", "16", "--d-model", "16", "--n-heads", "2",
        "--n-layers", "1", "--batch-size", "4", "--warmup-steps", "2", "--steps", str(STEPS), "--device", "cpu",
        "--attention", "sdpa", "--no-progress", "--checkpoint-every", "1", "--log-every", "1"]
# Moments of a save (open → writes → fsync of the file → rename → fsync of the directory)
MOMENTS = ["open", "first write", "middle write", "last write", "fsync", "replace", "directory fsync"]


class _Trainers:
    """Starts training processes: forks of one server process that has imported torch and
    flashlab (so each kill costs a training step, not an interpreter start)."""

    def __init__(self):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True, env=env, cwd=ROOT)

    def _send(self, text):
        self.server.stdin.write(text + "\n")
        self.server.stdin.flush()

    def run(self, out_dir, resume=None, kill_at=None):
        """Train in a fresh process; with ``kill_at``, SIGKILL it at that moment of its second
        save of checkpoint_last.pt (the first completes, so every life makes progress).
        Returns the process's exit code (-9 when killed)."""
        argv = [*ARGS, "--out-dir", str(out_dir)] + (["--resume", str(resume)] if resume else [])
        self._send(json.dumps(argv))
        pid, target, saves, events_of_save, writes_per_save = None, None, 0, [], None
        while True:
            line = self.server.stdout.readline()
            assert line, "the server died"
            word, _, rest = line.strip().partition(" ")
            if word == "PID":
                pid = int(rest)
            elif word == "EXIT":
                return int(rest)
            elif word == "TARGET":
                target = rest
            elif word == "EVENT":
                if target != "checkpoint_last.pt":                  # checkpoint_<step>.pt, metrics.csv
                    self._send("")
                    continue
                if rest == "open":
                    if saves == 1:
                        writes_per_save = events_of_save.count("write")
                    saves, events_of_save = saves + 1, []
                events_of_save.append(rest)
                if kill_at and saves == 2 and _is_moment(kill_at, events_of_save, writes_per_save):
                    os.kill(pid, signal.SIGKILL)
                    continue                                 # the server reports EXIT -9
                self._send("")

    def close(self):
        self.server.stdin.close()
        self.server.wait(timeout=60)


def _is_moment(moment, events, writes_per_save):
    writes = events.count("write")
    fsyncs = events.count("fsync")
    last = events[-1]
    return {"open": last == "open",
            "first write": last == "write" and writes == 1,
            "middle write": last == "write" and writes == max(1, writes_per_save // 2),
            "last write": last == "write" and writes == writes_per_save,
            "fsync": last == "fsync" and fsyncs == 1,
            "replace": last == "replace",
            "directory fsync": last == "fsync" and fsyncs == 2}[moment]


def _losses(path):
    with open(path, newline="") as f:
        return [(int(r["step"]), r["loss"]) for r in csv.DictReader(f)]


def test_sigkill_at_every_moment_of_a_save_then_resume(tmp_path):
    trainers = _Trainers()
    try:
        straight = tmp_path / "straight"
        assert trainers.run(straight) == 0
        out, last = tmp_path / "killed", tmp_path / "killed" / "checkpoint_last.pt"
        kills = []
        for moment in MOMENTS * 2:
            resume = last if last.exists() else None
            assert trainers.run(out, resume, kill_at=moment) == -signal.SIGKILL
            step = checkpoint.load(last, kind="lm-training-state").state["step"]     # always resumable
            kills.append((moment, step))
        assert trainers.run(out, last) == 0                                 # the last life finishes the run
    finally:
        trainers.close()
    assert len(kills) == 14 and [m for m, _ in kills] == MOMENTS * 2
    assert checkpoint.load(last).state["step"] == STEPS
    assert [s for s, _ in _losses(out / "metrics.csv")] == list(range(STEPS))   # each step once
    assert _losses(out / "metrics.csv") == _losses(straight / "metrics.csv")    # the same run, bit for bit
    assert not list(out.glob(".*.tmp"))                         # temporaries of killed saves are cleaned up
    print("kills (moment, checkpoint_last step after the kill):", kills)


# a model small enough that a CPU trains many steps before a signal arrives
TINY_TRAIN = ["--seq-len", "16", "--num-pairs", "2", "--vocab-size", "16", "--d-model", "16", "--n-heads", "2",
              "--n-layers", "1", "--device", "cpu", "--attention", "sdpa", "--no-progress"]


def _train_until_a_few_steps_are_logged(options, out, env, launcher=()):
    """``python [launcher…] -m flashlab train options… --out-dir out`` started for a million steps, returned
    (process, metrics.csv's path) once metrics.csv holds a few rows (or after 120 s)."""
    process = subprocess.Popen([sys.executable, *launcher, "-m", "flashlab", "train", *options, "--steps", "1000000",
                                "--out-dir", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.csv"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") > 3) and time.monotonic() < deadline:
        time.sleep(0.2)
    return process, metrics


def test_sigint_and_sigterm_stop_between_steps_save_and_resume(tmp_path):
    """Ctrl-C (SIGINT) or SIGTERM (a scheduler's stop) used to lose every step since the last
    periodic checkpoint, SIGINT with a 34-line traceback. Now the run stops after the step it is
    in, saves checkpoint_last.pt, says so at once and again in one line when it stops, and exits with 128 + the
    signal; resuming
    continues from exactly that step, with metrics.csv holding each step once."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for sig in (signal.SIGINT, signal.SIGTERM):
        out = tmp_path / sig.name
        process, metrics = _train_until_a_few_steps_are_logged([*TINY_TRAIN, "--batch-size", "4"], out, env)
        process.send_signal(sig)
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 128 + sig.value, stderr
        assert stderr.count("\n") == 2 and f"stopped by {sig.name} after step" in stderr, stderr
        assert stderr.startswith(f"{sig.name}: stopping after the current step"), stderr   # said at once
        step = checkpoint.load(out / "checkpoint_last.pt").state["step"]
        assert f"after step {step}: saved {out / 'checkpoint_last.pt'}" in stderr
        rows = list(csv.DictReader(metrics.open()))
        assert len(rows) == step                                  # every finished step logged once, none lost
        resume = ["--resume", str(out / "checkpoint_last.pt"), "--steps", str(step + 2), "--no-progress"]
        resumed = subprocess.run([sys.executable, "-m", "flashlab", "train", *resume], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
        assert len(list(csv.DictReader(metrics.open()))) == step + 2


def test_sigterm_to_torchrun_stops_every_rank_after_one_step_and_saves(tmp_path, capsys):
    """A practitioner's trial: `kill -TERM` to torchrun (which forwards it to each worker) left only
    metrics.csv, since the workers had no stop handler. Now both ranks stop after the same step, rank 0
    saves it, one line says so, and every finished step is in metrics.csv once. The ranks share their
    run's --out-dir (rank 0 holds it, neither is refused), and another run into it is refused naming
    rank 0, a worker of this torchrun."""
    from flashlab.cli import main

    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process, metrics = _train_until_a_few_steps_are_logged([*TINY_TRAIN, "--batch-size", "8"], out, env,
                                                           launcher=["-m", "torch.distributed.run",
                                                                     "--nproc_per_node", "2"])
    assert main(["train", *TINY_TRAIN, "--steps", "2", "--out-dir", str(out)]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and f"--out-dir: {out} is in use by another run (process " in said, said
    holder = int(said.split("(process ")[1].split()[0])
    assert Path(f"/proc/{holder}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(process.pid)   # its parent
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    step = checkpoint.load(out / "checkpoint_last.pt").state["step"]
    assert stderr.count(f"stopped by SIGTERM after step {step}: saved {out / 'checkpoint_last.pt'}") == 1, stderr
    assert [int(row["step"]) for row in csv.DictReader(metrics.open())] == list(range(step))
