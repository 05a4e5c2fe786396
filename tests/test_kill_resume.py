"""SIGKILL a real training process at every moment of its checkpoint save, again and again,
and resume each time: a kill never leaves a checkpoint that cannot be resumed, and the
finished run's metrics.csv has each step once, with the losses of an uninterrupted run.

The child is ``python -m flashlab train`` itself; the only change is that the checkpoint
module's file writes, fsyncs and rename announce themselves on stdout and wait for the
parent's go-ahead on stdin, so the parent can kill at an exact moment of a save."""

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

from flashlab import checkpoint

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import os, sys, types
import flashlab.checkpoint as ck

def announce(event):
    print("EVENT", event, flush=True)
    if not sys.stdin.readline():            # the parent closed stdin: stop waiting
        sys.exit(3)

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
ck.os, ck.open, ck.WRITE_CHUNK = proxy, announcing_open, 4096
from flashlab.__main__ import main
sys.exit(main(sys.argv[1:]))
"""

STEPS = 32
ARGS = ["train", "--seq-len", "16", "--num-pairs", "2", "--vocab-size", "16", "--d-model", "16", "--n-heads", "2",
        "--n-layers", "1", "--batch-size", "4", "--warmup-steps", "2", "--steps", str(STEPS), "--device", "cpu",
        "--attention", "sdpa", "--no-progress", "--checkpoint-every", "1", "--log-every", "1"]
# Moments of a save (open → writes → fsync of the file → rename → fsync of the directory)
MOMENTS = ["open", "first write", "middle write", "last write", "fsync", "replace", "directory fsync"]


def _child(out_dir, resume):
    argv = [*ARGS, "--out-dir", str(out_dir)] + (["--resume", str(resume)] if resume else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", CHILD, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _run(out_dir, resume=None, kill_at=None):
    """Run a child; with ``kill_at``, SIGKILL it at that moment of its fourth file write: each
    step writes checkpoint_<step>.pt then checkpoint_last.pt, so that is the second step's
    checkpoint_last.pt, and the first step's is complete (every life makes progress).
    Returns 0 or the kill signal."""
    child = _child(out_dir, resume)
    saves, events_of_save, writes_per_save = 0, [], None
    while True:
        line = child.stdout.readline()
        if not line:
            break
        if not line.startswith("EVENT "):
            continue
        event = line.split()[1]
        if event == "open":
            if saves == 3:
                writes_per_save = events_of_save.count("write")
            saves, events_of_save = saves + 1, []
        events_of_save.append(event)
        if kill_at and saves == 4 and _is_moment(kill_at, events_of_save, writes_per_save):
            child.send_signal(signal.SIGKILL)
            child.wait()
            return -signal.SIGKILL
        child.stdin.write("\n")
        child.stdin.flush()
    child.wait()
    assert child.returncode == 0, child.stderr.read()
    return 0


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
    straight = tmp_path / "straight"
    assert _run(straight) == 0
    out, last = tmp_path / "killed", tmp_path / "killed" / "checkpoint_last.pt"
    kills = []
    for moment in MOMENTS * 2:
        resume = last if last.exists() else None
        assert _run(out, resume, kill_at=moment) == -signal.SIGKILL
        assert checkpoint.load(last, kind="lm-training-state").state["step"] >= 1   # always resumable
        kills.append(moment)
    assert _run(out, last) == 0                                   # the last life finishes the run
    assert len(kills) == 14
    assert checkpoint.load(last).state["step"] == STEPS
    assert [s for s, _ in _losses(out / "metrics.csv")] == list(range(STEPS))   # each step once
    assert _losses(out / "metrics.csv") == _losses(straight / "metrics.csv")    # the same run, bit for bit
    assert not list(out.glob(".*.tmp"))                         # temporaries of killed saves are cleaned up
