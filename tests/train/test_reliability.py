"""Runs that survive a shared machine (flashlab.train.run_dir, memory, checkpoint, autotune_cache):

- one run per --out-dir: 2, 4 and 8 runs started at one instant into one directory, and as many
  resumes of one checkpoint: exactly one runs, the rest are refused in one line, and metrics.csv is
  that of one uninterrupted run; a SIGKILLed run never blocks the next; a temporary file whose writer
  lives is never cleaned up;
- a full, read-only, forbidden or failing disk at each write of a run: one line (what failed, the last
  good checkpoint, the command that resumes), exit status 1, nothing half-written, and the printed
  command finishes the run as if nothing happened; on a real full and read-only tmpfs where this
  machine lets a test mount one;
- impossible sizes refused before anything is allocated, in one line with the estimate;
- the autotuner's cache read and written like a checkpoint;
- a run killed in its first save of checkpoint_last.pt: the refusal names the newest complete
  checkpoint and the command that resumes it; --resume auto;
- a checkpoint validated as a whole (settings, weights, the rest), a damaged file called damaged.

Real processes are forks of one server that imported torch once (as tests/train/test_kill_resume.py
does), so that eight concurrent runs cost eight training steps, not eight interpreter starts.
"""

import contextlib
import csv
import errno
import io
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import types
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from flashlab.cli import main
from flashlab.launch import autotune, autotune_cache
from flashlab.train import checkpoint, memory, run_dir
from flashlab.train import trainer as trainer_module
from flashlab.train.config import ConfigError
from flashlab.train.trainer import RecallConfig, RunConfig, Trainer

ROOT = Path(__file__).resolve().parents[2]
TSP_MODEL = str(ROOT / "checkpoints" / "am_tsp20.pt")

TINY = ["train", "--seq-len", "16", "--num-pairs", "2", "--vocab-size", "16", "--d-model", "16", "--n-heads", "2",
        "--n-layers", "1", "--device", "cpu", "--attention", "sdpa", "--no-progress", "--batch-size", "4"]
TINY_TSP = ["train-tsp", "--n-nodes", "5", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--ff-dim", "32",
            "--epoch-steps", "3", "--eval-instances", "8", "--rollout-batch", "16", "--batch-size", "4",
            "--attention", "sdpa", "--device", "cpu", "--no-progress"]
# the columns of metrics.csv that a run reproduces exactly (the rest are timings)
SAME = ("step", "loss", "accuracy", "grad_norm", "lr", "loss_scale", "skipped")


def _rows(path):
    with open(path, newline="") as f:
        return [tuple(row[c] for c in SAME) for row in csv.DictReader(f)]


def _run(argv, capsys):
    """main(argv) in this process: (exit status, stdout, stderr's lines)."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def _one_line(lines, status, code, *expected):
    assert code == status and len(lines) == 1, (code, lines)
    assert "Traceback" not in lines[0] and lines[0].startswith("python -m flashlab "), lines
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """metrics.csv rows of uninterrupted tiny runs: {steps: rows}."""
    base = tmp_path_factory.mktemp("straight")
    rows = {}
    for steps in (6, 12):
        with contextlib.redirect_stdout(io.StringIO()):
            assert main([*TINY, "--steps", str(steps), "--out-dir", str(base / str(steps))]) == 0
        rows[steps] = _rows(base / str(steps) / "metrics.csv")
    return rows


# ---------------------------------------------------------------- real processes, started at one instant
SERVER = r"""
import json, os, signal, sys, traceback, types
import flashlab.train.checkpoint as ck
from flashlab.cli import main          # torch and flashlab imported once, before any fork
import flashlab.train.documents, flashlab.train.tsp_train, tqdm.auto   # what main imports when it runs

def die_before_the_first_rename_of_checkpoint_last():
    real = os.replace
    def replace(source, target):
        if os.path.basename(str(target)) == "checkpoint_last.pt":
            os.kill(os.getpid(), signal.SIGKILL)
        return real(source, target)
    proxy = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
    proxy.replace = replace
    ck.os = proxy

for line in sys.stdin:                 # one request per line: the runs to start together, as JSON
    runs = json.loads(line)
    go_read, go_write = os.pipe()
    pids = []
    for run in runs:
        pid = os.fork()
        if pid == 0:
            os.close(go_write)
            for fd, name in ((1, "out"), (2, "err")):
                os.dup2(os.open(f"{run['log']}.{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            if run.get("die_in_first_save"):
                die_before_the_first_rename_of_checkpoint_last()
            os.read(go_read, 1)        # every run waits here until all are forked
            try:
                code = main(run["argv"])
            except BaseException:
                traceback.print_exc()
                code = 99
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        pids.append(pid)
    os.close(go_read)
    print("PIDS", json.dumps(pids), flush=True)
    os.write(go_write, b"x" * len(runs))   # go, all at once
    os.close(go_write)
    print("EXITS", json.dumps([os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]), flush=True)
"""


class _Forks:
    def __init__(self):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True, env=env, cwd=ROOT)

    def start(self, runs) -> list[int]:
        self.server.stdin.write(json.dumps(runs) + "\n")
        self.server.stdin.flush()
        word, pids = self.server.stdout.readline().split(" ", 1)
        assert word == "PIDS", word
        return json.loads(pids)

    def wait(self) -> list[int]:
        word, exits = self.server.stdout.readline().split(" ", 1)
        assert word == "EXITS", word
        return json.loads(exits)

    def run(self, runs):
        pids = self.start(runs)
        return pids, self.wait()


@pytest.fixture(scope="module")
def forks():
    server = _Forks()
    yield server
    server.server.stdin.close()
    server.server.wait(timeout=60)


@pytest.fixture(scope="module")
def forked_straight(forks, tmp_path_factory):
    """As `straight`, run in a fork of the server (one thread: its float sums are not this process's)."""
    base = tmp_path_factory.mktemp("forked_straight")
    runs = [{"argv": [*TINY, "--steps", str(steps), "--out-dir", str(base / str(steps))], "log": str(base / str(steps))}
            for steps in (6, 12)]
    assert forks.run(runs)[1] == [0, 0]
    return {steps: _rows(base / str(steps) / "metrics.csv") for steps in (6, 12)}


def _logs(log):
    return Path(f"{log}.out").read_text(), Path(f"{log}.err").read_text().strip().splitlines()


REFUSED = ("is in use by another run (process ", "holds a run already", "was replaced while this run started",
           "--steps: the checkpoint is at step 12 already")


@pytest.mark.parametrize("resume", [False, True], ids=["new runs", "resumes"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_of_n_runs_started_at_once_into_one_out_dir_exactly_one_runs(forks, forked_straight, tmp_path, n, resume):
    """Found by an audit: two runs into one --out-dir both ran, one died with FileNotFoundError (the
    other's cleanup removed its temporary file) and metrics.csv held both runs' rows, interleaved; two
    resumes of one checkpoint did the same. Now the first to take the directory's lock runs, every
    other one is refused in one line (naming the process that holds it, or, if it came after that run
    ended, what it would overwrite), and metrics.csv is an uninterrupted run's."""
    out = tmp_path / "run"
    if resume:
        assert forks.run([{"argv": [*TINY, "--steps", "4", "--checkpoint-every", "2", "--out-dir", str(out)],
                           "log": str(tmp_path / "first")}])[1] == [0]
        argv = ["train", "--resume", str(out / "checkpoint_last.pt"), "--steps", "12", "--no-progress"]
    else:
        argv = [*TINY, "--steps", "12", "--checkpoint-every", "1", "--out-dir", str(out)]
    runs = [{"argv": argv, "log": str(tmp_path / f"run{i}")} for i in range(n)]
    pids, exits = forks.run(runs)
    assert sorted(exits) == [0] + [2] * (n - 1), exits
    winner = pids[exits.index(0)]
    for run, code in zip(runs, exits):
        stdout, lines = _logs(run["log"])
        if code == 0:
            continue
        assert len(lines) == 1 and "Traceback" not in lines[0] and stdout == "", lines
        assert any(reason in lines[0] for reason in REFUSED), lines[0]
        if "in use" in lines[0]:
            # the one that runs, or one refused after holding the lock for a moment (a resume whose
            # checkpoint the winner replaced while it waited): a process of this test either way
            assert any(f"(process {pid} on " in lines[0] for pid in pids), (winner, pids, lines[0])
    assert _rows(out / "metrics.csv") == forked_straight[12]
    assert checkpoint.load(out / "checkpoint_last.pt").state["step"] == 12
    assert not list(out.glob(".*.tmp"))


def test_a_sigkilled_run_never_blocks_the_next_and_is_named_while_it_lives(forks, tmp_path, capsys):
    """The lock is the operating system's (flock): held while the run lives, so a run into its
    directory is refused naming its process, and gone the moment it is killed (no stale lock file to
    delete by hand): the next run resumes where the killed one last saved."""
    out = tmp_path / "run"
    log = tmp_path / "long"
    (pid,) = forks.start([{"argv": [*TINY, "--steps", "1000000", "--checkpoint-every", "2", "--out-dir", str(out)],
                           "log": str(log)}])
    deadline = time.monotonic() + 120
    while not (out / "checkpoint_last.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    code, stdout, lines = _run(["train", "--resume", str(out / "checkpoint_last.pt"), "--steps", "1000001",
                                "--no-progress"], capsys)
    _one_line(lines, 2, code, f"--out-dir: {out} is in use by another run (process {pid} on ",
              f"which holds {out / '.run.lock'}); wait for it to end, or give another directory.")
    code, stdout, lines = _run([*TINY, "--steps", "6", "--out-dir", str(out)], capsys)
    _one_line(lines, 2, code, f"is in use by another run (process {pid} on ")
    os.kill(pid, signal.SIGKILL)
    assert forks.wait() == [-signal.SIGKILL]
    reached = run_dir.newest_checkpoint(out)[1]               # where the killed run last saved
    code, stdout, lines = _run(["train", "--resume", "auto", "--out-dir", str(out), "--steps", str(reached + 2),
                                "--no-progress"], capsys)
    assert code == 0 and lines == [], lines
    assert stdout.startswith(f"resume auto: the newest complete checkpoint in {out} is ")
    rows = _rows(out / "metrics.csv")
    assert [int(r[0]) for r in rows] == list(range(reached + 2))                    # each step once


def test_a_resume_whose_checkpoint_was_replaced_while_it_waited_is_refused(tmp_path, capsys, monkeypatch):
    """The race the lock leaves: a resume reads checkpoint_last.pt, and before it takes the directory the
    run that held it saves a newer one and ends. Resuming the state read first would train those steps
    again over the newer run; the resume is refused instead, and nothing is written."""
    out = tmp_path / "run"
    assert main([*TINY, "--steps", "4", "--checkpoint-every", "2", "--out-dir", str(out)]) == 0
    newer = (out / "checkpoint_last.pt").read_bytes()
    shutil.copyfile(out / "checkpoint_2.pt", out / "checkpoint_last.pt")      # where the resume finds the run
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "checkpoint_last.pt"}
    original = Trainer.hold_out_dir

    def the_other_run_saves_and_ends_first(self):
        checkpoint.write_atomically(out / "checkpoint_last.pt", newer)
        original(self)
    monkeypatch.setattr(Trainer, "hold_out_dir", the_other_run_saves_and_ends_first)
    capsys.readouterr()
    code, stdout, lines = _run(["train", "--resume", str(out / "checkpoint_last.pt"), "--steps", "6",
                                "--no-progress"], capsys)
    _one_line(lines, 2, code, f"--resume: {out / 'checkpoint_last.pt'} was replaced while this run started, by the "
                              f"run that held {out} and has ended since; resume again")
    assert (out / "checkpoint_last.pt").read_bytes() == newer
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "checkpoint_last.pt"} == before


def test_holding_a_directory_counts_and_a_refused_run_leaves_none_behind(tmp_path, capsys):
    """A command and its Trainer both take the directory (held once, given back by the last); a directory
    made only to be locked, by a run refused before writing anything, is removed again with its parents
    (a refused run leaves no directory behind); an existing one keeps its lock file."""
    new = tmp_path / "runs" / "x"
    run_dir.hold(new)
    run_dir.hold(new)
    assert (new / ".run.lock").read_text().startswith(f"process {os.getpid()} on ")
    run_dir.release(new)
    assert (new / ".run.lock").exists()
    run_dir.release(new)
    assert not (tmp_path / "runs").exists()
    run_dir.hold(tmp_path)
    run_dir.release_all()
    assert (tmp_path / ".run.lock").exists()
    (tmp_path / "victim").write_text("mine")
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / ".run.lock").symlink_to(tmp_path / "victim")     # not followed
    with pytest.raises(ConfigError, match="^out_dir: cannot create the lock file .*planted/.run.lock"):
        run_dir.hold(tmp_path / "planted")
    assert (tmp_path / "victim").read_text() == "mine"
    code, _, lines = _run([*TINY, "--steps", "2", "--keep-checkpoints", "2", "--out-dir", str(new)], capsys)
    _one_line(lines, 2, code, "--keep-checkpoints: it prunes the checkpoint_<step>.pt files")
    assert not (tmp_path / "runs").exists()


def test_cleanup_after_a_killed_save_spares_a_live_writers_file(tmp_path):
    """remove_interrupted_writes deleted every temporary file, another live run's included (the
    audit's FileNotFoundError). A temporary file's name now carries its writer's process id: one of a
    process that lives stays, one of a dead process or of the old naming goes."""
    live = tmp_path / f".checkpoint_last.pt.{os.getppid()}.a1b2c3d4.tmp"       # pytest's parent: alive
    dead = tmp_path / f".checkpoint_7.pt.{2**22 + 1}.e5f6g7h8.tmp"             # above any Linux pid_max
    old = tmp_path / ".checkpoint_6.pt.k1ll3d.tmp"
    mine = tmp_path / f".metrics.csv.{os.getpid()}.zzzzzzzz.tmp"               # this process's, not in flight
    for path in (live, dead, old, mine):
        path.write_bytes(b"half a file")
    checkpoint.remove_interrupted_writes(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]
    checkpoint.write_atomically(tmp_path / "checkpoint_last.pt", b"new")      # a save to the same name: spared
    assert live.exists() and (tmp_path / "checkpoint_last.pt").read_bytes() == b"new"
    written = []
    real_mkstemp = checkpoint.tempfile.mkstemp

    def mkstemp(**kwargs):
        handle, name = real_mkstemp(**kwargs)
        written.append(Path(name).name)
        return handle, name
    checkpoint.tempfile.mkstemp, saved = mkstemp, checkpoint.tempfile.mkstemp
    try:
        checkpoint.write_atomically(tmp_path / "x.pt", b"data")
    finally:
        checkpoint.tempfile.mkstemp = saved
    assert written[0].startswith(f".x.pt.{os.getpid()}.") and written[0].endswith(".tmp")


def test_a_run_killed_in_its_first_save_is_named_with_the_command_that_resumes_it(forks, forked_straight, tmp_path,
                                                                                    capsys):
    """Found by an audit: 3 of 31 kills hit the first save of checkpoint_last.pt; a new run into that
    directory was refused as holding "no checkpoint to resume from" though checkpoint_1.pt was complete.
    Now the refusal names the newest complete checkpoint and the command that resumes it (which then
    finishes the run as if uninterrupted), and --resume auto finds it too."""
    out = tmp_path / "run"
    argv = [*TINY, "--steps", "6", "--checkpoint-every", "1", "--out-dir", str(out)]
    assert forks.run([{"argv": argv, "log": str(tmp_path / "killed"), "die_in_first_save": True}])[1] == \
        [-signal.SIGKILL]
    assert not (out / "checkpoint_last.pt").exists() and (out / "checkpoint_1.pt").exists()
    assert list(out.glob(".checkpoint_last.pt.*.tmp")), "killed between its write and its rename"
    shutil.copytree(out, tmp_path / "copy")
    code, stdout, lines = _run(argv, capsys)
    said = _one_line(lines, 2, code, f"--out-dir: {out} holds a run already, whose save of checkpoint_last.pt was "
                                     f"cut short; its newest complete checkpoint is {out / 'checkpoint_1.pt'} "
                                     f"(step 1): continue it with python -m flashlab train --resume "
                                     f"{out / 'checkpoint_1.pt'} (or --resume auto --out-dir {out})")
    command = said.split("continue it with python -m flashlab ")[1].split(" (or")[0].split()
    assert command == ["train", "--resume", str(out / "checkpoint_1.pt")]
    copy = tmp_path / "copy"
    resumes = [{"argv": [*command, "--no-progress"], "log": str(tmp_path / "resumed")},
               {"argv": ["train", "--resume", "auto", "--out-dir", str(copy), "--no-progress"],
                "log": str(tmp_path / "auto")}]
    assert forks.run(resumes)[1] == [0, 0]
    assert _rows(out / "metrics.csv") == forked_straight[6] and not list(out.glob(".*.tmp"))
    assert f"resume auto: the newest complete checkpoint in {copy} is {copy / 'checkpoint_1.pt'} (step 1)" in \
        _logs(tmp_path / "auto")[0]
    assert _rows(copy / "metrics.csv") == forked_straight[6]


def test_resume_auto(tmp_path, capsys):
    """--resume auto: the newest complete checkpoint in --out-dir (checkpoint_last.pt where it is as
    new as any, a damaged one passed over), a new run where there is none, and without --out-dir a
    one-line refusal."""
    code, _, lines = _run(["train", "--resume", "auto", "--steps", "2"], capsys)
    _one_line(lines, 2, code, "--resume: auto resumes the newest complete checkpoint in --out-dir; add --out-dir DIR.")
    out = tmp_path / "run"
    code, stdout, lines = _run([*TINY, "--steps", "4", "--checkpoint-every", "2", "--resume", "auto", "--out-dir",
                                str(out)], capsys)
    assert code == 0 and stdout.startswith(f"resume auto: {out} holds no checkpoint: a new run starts\n"), stdout
    assert run_dir.newest_checkpoint(out) == (out / "checkpoint_last.pt", 4)
    (out / "checkpoint_last.pt").write_bytes(b"PK\x03\x04 damaged")
    assert run_dir.newest_checkpoint(out) == (out / "checkpoint_4.pt", 4)
    (out / "checkpoint_4.pt").unlink()
    assert run_dir.newest_checkpoint(out) == (out / "checkpoint_2.pt", 2)
    with pytest.raises(ConfigError, match="^resume: auto resumes the newest checkpoint in out_dir"):
        RunConfig(resume="auto").check()
    resumed = Trainer(RecallConfig(seq_len=16, num_pairs=2, vocab_size=16, d_model=16, n_heads=2, n_layers=1,
                                   attention="sdpa"),
                      RunConfig(batch_size=4, steps=5, device="cpu", progress=False, resume="auto", out_dir=str(out)))
    assert resumed.step == 2 and resumed.run.resume == str(out / "checkpoint_2.pt")


# ---------------------------------------------------------------- write failures, injected at each write
ERRNOS = [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EIO]


class _Faults:
    """Makes one write of a run fail with ``code``: the write path of flashlab.train.checkpoint (its
    open, write, fsync and rename, through a proxy of ``os`` as tests/train/test_kill_resume.py does)
    and metrics.csv's appends and the pruning of old checkpoints (pathlib)."""

    def __init__(self, monkeypatch, code, point):
        self.code, self.point, self.target, self.fired = code, point, None, False
        self.writes = self.fsyncs = 0
        proxy = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
        proxy.fsync, proxy.replace = self.fsync, self.replace
        monkeypatch.setattr(checkpoint, "os", proxy)
        monkeypatch.setattr(checkpoint, "WRITE_CHUNK", 8192)
        monkeypatch.setattr(checkpoint, "open", self.open, raising=False)
        real_write_atomically = checkpoint.write_atomically

        def write_atomically(path, data):
            self.target, self.writes, self.fsyncs = Path(path).name, 0, 0
            return real_write_atomically(path, data)
        monkeypatch.setattr(checkpoint, "write_atomically", write_atomically)
        self.real_path_open, self.real_unlink = pathlib.Path.open, pathlib.Path.unlink
        # functions, not bound methods, so that the path they are called on comes first
        monkeypatch.setattr(pathlib.Path, "open", lambda path, *args, **kwargs: self.path_open(path, *args, **kwargs))
        monkeypatch.setattr(pathlib.Path, "unlink", lambda path, missing_ok=False: self.unlink(path, missing_ok))
        self.appends = 0

    def fail(self, when: bool) -> None:
        if when and not self.fired:
            self.fired = True
            raise OSError(self.code, os.strerror(self.code))

    def open(self, file, mode="r", *args, **kwargs):
        f = open(file, mode, *args, **kwargs)
        faults = self

        class Writes:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

            def write(self, data):
                faults.writes += 1
                point = {1: f"{faults.target} first write", 2: f"{faults.target} second write"}.get(faults.writes)
                if faults.point == point and not faults.fired:
                    f.write(data[:len(data) // 2])               # half of it lands, then the disk fails
                faults.fail(faults.point == point)
                return f.write(data)

            def __getattr__(self, name):
                return getattr(f, name)
        return Writes()

    def fsync(self, fd):
        self.fsyncs += 1
        self.fail(self.point == f"{self.target} {'fsync' if self.fsyncs == 1 else 'directory fsync'}")
        os.fsync(fd)

    def replace(self, source, target):
        self.fail(self.point == f"{Path(target).name} rename")
        os.replace(source, target)

    def path_open(self, path, mode="r", *args, **kwargs):
        f = self.real_path_open(path, mode, *args, **kwargs)
        if path.name != "metrics.csv" or "a" not in mode:
            return f
        self.appends += 1
        if self.point != f"metrics.csv row {self.appends}" or self.fired:
            return f
        faults = self

        class HalfRow:                                       # half the row lands, then the disk fails
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

            def write(self, data):
                f.write(data[:len(data) // 2])
                f.flush()
                faults.fail(True)
        return HalfRow()

    def unlink(self, path, missing_ok=False):
        self.fail(self.point == f"{path.name} unlink")
        return self.real_unlink(path, missing_ok=missing_ok)


# (write that fails, the last good checkpoint then, its step) in a run of 6 steps with a checkpoint every 2
POINTS = [("metrics.csv row 4", "checkpoint_last.pt", 2),          # step 3's row, cut in half
          ("checkpoint_4.pt first write", "checkpoint_last.pt", 2),
          ("checkpoint_4.pt second write", "checkpoint_last.pt", 2),
          ("checkpoint_4.pt fsync", "checkpoint_last.pt", 2),
          ("checkpoint_4.pt rename", "checkpoint_last.pt", 2),
          ("checkpoint_4.pt directory fsync", "checkpoint_last.pt", 2),  # renamed, but not known to be durable
          ("checkpoint_last.pt first write", "checkpoint_2.pt", 2),      # the first: none before it
          ("checkpoint_2.pt unlink", "checkpoint_last.pt", 4)]           # --keep-checkpoints 1 prunes it


@pytest.mark.parametrize("code", ERRNOS, ids=[errno.errorcode[c] for c in ERRNOS])
@pytest.mark.parametrize("point,last_good,step", POINTS, ids=[p for p, _, _ in POINTS])
def test_a_failed_write_ends_the_run_in_one_line_and_the_printed_command_resumes_it(
        straight, tmp_path, capsys, monkeypatch, code, point, last_good, step):
    """Found by an audit: a full (ENOSPC) or read-only (EROFS) disk mid-run ended in a traceback,
    exit 1. Now each such error at each write says in one line what failed, the last good
    checkpoint and the command that resumes; the temporary file is gone, metrics.csv holds whole
    rows only, and the printed command (the disk fixed) finishes a run equal to an uninterrupted one."""
    out = tmp_path / "run"
    argv = [*TINY, "--steps", "6", "--checkpoint-every", "2", "--out-dir", str(out)]
    if point.endswith("unlink"):
        argv += ["--keep-checkpoints", "1"]
    faults = _Faults(monkeypatch, code, point)
    status, stdout, lines = _run(argv, capsys)
    assert faults.fired, point
    said = _one_line(lines, 1, status, "python -m flashlab train: error: ", f"failed: {os.strerror(code)}; ",
                     f"the last good checkpoint is {out / last_good} (step {step}): ",
                     f"then resume with: python -m flashlab train --resume {out / last_good}")
    assert said.endswith(f"--resume {out / last_good}"), said
    monkeypatch.undo()                                                  # the disk is fixed
    assert checkpoint.load(out / last_good).state["step"] == step
    assert not list(out.glob(".*.tmp")), "no temporary file left behind"
    with open(out / "metrics.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert all(len(row) == len(rows[0]) for row in rows), "no half row"
    command = said.split("resume with: python -m flashlab ")[1].split()
    assert _run([*command, "--no-progress"], capsys)[0] == 0
    assert _rows(out / "metrics.csv") == straight[6]


@pytest.mark.parametrize("code", ERRNOS, ids=[errno.errorcode[c] for c in ERRNOS])
def test_the_other_writes_fail_in_one_line_too(tmp_path, capsys, monkeypatch, code):
    """A fresh run that fails before any checkpoint says nothing can be resumed and how to start
    again; one that fails in its last save, where its final state is; a resume that fails cutting
    metrics.csv back names the checkpoint it resumed; train-tsp's
    export, eval-tsp --save-tours and export-tsp --out name the file and leave none half-written."""
    strerror = os.strerror(code)
    out = tmp_path / "fresh"
    _Faults(monkeypatch, code, "metrics.csv row 1")
    status, _, lines = _run([*TINY, "--steps", "4", "--out-dir", str(out)], capsys)
    _one_line(lines, 1, status, f"appending step 0 to {out / 'metrics.csv'} failed: {strerror}; no checkpoint of "
                                f"this run was saved, so nothing can be resumed: ",
              f"then start the run again (delete {out} first, or give another --out-dir).")
    assert not (out / "metrics.csv").exists()                            # not even a header is left
    monkeypatch.undo()

    end = tmp_path / "end"                                  # the last save of a run that trained every step
    _Faults(monkeypatch, code, "checkpoint_last.pt first write")
    status, _, lines = _run([*TINY, "--steps", "4", "--checkpoint-every", "4", "--out-dir", str(end)], capsys)
    _one_line(lines, 1, status, f"saving {end / 'checkpoint_last.pt'} failed: {strerror}; the run had trained every "
                                f"step, and its final state is saved in {end / 'checkpoint_4.pt'} (step 4): ")
    monkeypatch.undo()

    run = tmp_path / "run"
    assert _run([*TINY, "--steps", "6", "--checkpoint-every", "2", "--out-dir", str(run)], capsys)[0] == 0
    _Faults(monkeypatch, code, "metrics.csv first write")
    status, _, lines = _run(["train", "--resume", str(run / "checkpoint_2.pt"), "--steps", "6", "--no-progress"],
                            capsys)
    _one_line(lines, 1, status, f"cutting {run / 'metrics.csv'} back to step 2 failed: {strerror}; the last good "
                                f"checkpoint is {run / 'checkpoint_2.pt'} (step 2)")
    assert len(list(csv.reader(open(run / "metrics.csv")))) == 7           # untouched: header and 6 rows
    monkeypatch.undo()

    tsp = tmp_path / "tsp"
    _Faults(monkeypatch, code, "am_tsp5.pt first write")
    status, _, lines = _run([*TINY_TSP, "--steps", "2", "--out-dir", str(tsp)], capsys)
    said = _one_line(lines, 1, status, f"exporting {tsp}/am_tsp5.pt failed: {strerror}; the run itself is saved in "
                                       f"{tsp / 'checkpoint_last.pt'} (step 2)")
    monkeypatch.undo()
    assert not (tsp / "am_tsp5.pt").exists() and not list(tsp.glob(".*.tmp"))
    command = said.split("write the policy with: python -m flashlab ")[1].split()
    assert _run(command, capsys)[0] == 0 and (tsp / "am_tsp5.pt").exists()

    _Faults(monkeypatch, code, "tours.npz first write")
    status, _, lines = _run(["eval-tsp", "--checkpoint", str(tsp / "am_tsp5.pt"), "--instances", "4", "--attention",
                             "sdpa", "--save-tours", str(tmp_path / "tours.npz")], capsys)
    _one_line(lines, 1, status, f"--save-tours: writing {tmp_path / 'tours.npz'} failed: {strerror}; nothing was "
                                f"written there")
    monkeypatch.undo()
    _Faults(monkeypatch, code, "am.pt rename")
    status, _, lines = _run(["export-tsp", "--checkpoint", str(tsp / "checkpoint_last.pt"), "--out",
                             str(tmp_path / "am.pt")], capsys)
    _one_line(lines, 1, status, f"--out: writing {tmp_path / 'am.pt'} failed: {strerror}; nothing was written there")
    monkeypatch.undo()
    assert not (tmp_path / "tours.npz").exists() and not (tmp_path / "am.pt").exists()
    assert not list(tmp_path.glob(".*.tmp"))


# ---------------------------------------------------------------- a real full and read-only disk
@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs at tmp_path/disk, where this machine lets a test mount one (root); else skipped,
    the injected faults above standing in."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode})")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _remount(disk, options):
    subprocess.run(["mount", "-o", f"remount,{options}", str(disk)], check=True, capture_output=True)


def test_a_real_full_and_read_only_disk(small_disk, straight, capsys, monkeypatch):
    """On a real 512 KiB tmpfs the run's checkpoints fill the disk (ENOSPC) within a few steps; then a
    remount read-only mid-run (EROFS). Each ends in one line with exit status 1, the last good
    checkpoint intact, and once the disk is fixed the printed command finishes the run exactly."""
    out = small_disk / "full"
    status, _, lines = _run([*TINY, "--steps", "12", "--checkpoint-every", "1", "--out-dir", str(out)], capsys)
    said = _one_line(lines, 1, status, "failed: No space left on device; the last good checkpoint is ")
    assert not list(out.glob(".*.tmp"))
    _remount(small_disk, "size=16M")
    command = said.split("resume with: python -m flashlab ")[1].split()
    assert _run([*command, "--no-progress"], capsys)[0] == 0
    assert _rows(out / "metrics.csv") == straight[12]

    out = small_disk / "read-only"
    original = trainer_module.Trainer.on_step_end

    def remount_at_step_3(self, metrics):
        original(self, metrics)
        if metrics["step"] == 3:
            _remount(small_disk, "ro")
    monkeypatch.setattr(trainer_module.Trainer, "on_step_end", remount_at_step_3)
    status, _, lines = _run([*TINY, "--steps", "12", "--checkpoint-every", "2", "--out-dir", str(out)], capsys)
    said = _one_line(lines, 1, status, f"appending step 3 to {out / 'metrics.csv'} failed: Read-only file system; "
                                       f"the last good checkpoint is {out / 'checkpoint_last.pt'} (step 2)")
    monkeypatch.undo()
    _remount(small_disk, "rw")
    command = said.split("resume with: python -m flashlab ")[1].split()
    assert _run([*command, "--no-progress"], capsys)[0] == 0
    assert _rows(out / "metrics.csv") == straight[12]


# ---------------------------------------------------------------- impossible sizes
@pytest.mark.parametrize("argv,option", [
    (["train", "--seq-len", "100000000"], "--seq-len: 100000000 needs at least "),
    (["train", "--d-model", "100000000"], "--d-model: 100000000 needs at least "),
    (["train", "--vocab-size", "10000000000"], "--vocab-size: 10000000000 needs at least "),
    (["train", "--batch-size", "10000000000"], "--batch-size: 10000000000 needs at least "),
    (["train", "--task", "documents", "--max-len", "1000000000"], "--max-len: 1000000000 needs at least "),
    (["train-tsp", "--n-nodes", "100000000"], "--n-nodes: 100000000 needs at least "),
    (["train-tsp", "--eval-instances", "100000000000"], "--eval-instances: 100000000000 needs at least "),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--nodes", "100000000"], "--nodes: 100000000 needs at least "),
    (["eval-tsp", "--checkpoint", TSP_MODEL, "--instances", "100000000000"], "--instances: 100000000000 needs at "),
])
def test_an_impossible_size_is_refused_before_anything_is_allocated(argv, option, capsys):
    """Found by an audit: these ended in allocator tracebacks after 11 s, or (train-tsp --n-nodes)
    in the kernel's out-of-memory kill after 67 s. Now one line, before any work, with the estimate
    and the free memory it exceeds, naming the setting that costs the most."""
    started = time.perf_counter()
    code, stdout, lines = _run([*argv, "--device", "cpu"] if argv[0] != "eval-tsp" else argv, capsys)
    said = _one_line(lines, 2, code, option, "of memory (", "this machine has free; give a smaller value.")
    assert stdout == "" and time.perf_counter() - started < 20, said


def test_the_estimate_names_what_costs_most_and_counts_every_process(monkeypatch):
    """A machine with 64 MiB free (pretended): a run that fits passes, a batch past it is refused
    naming --batch-size, and two CPU processes of a torchrun job on one machine count twice."""
    monkeypatch.setattr(memory, "available_bytes", lambda device: (64 * 2**20, "this machine"))
    task = RecallConfig(seq_len=64, d_model=32, n_heads=2, n_layers=1, attention="sdpa")
    run = RunConfig(batch_size=8, device="cpu", progress=False)
    trainer = Trainer(task, run)
    needs = sum(trainer.memory_needs(task, run).values())
    assert 0 < needs < 64 * 2**20
    with pytest.raises(ConfigError, match=r"^batch_size: 20000 needs at least .* of memory \(.*\), more than the "
                                          r"64.0 MiB this machine has free"):
        Trainer(task, RunConfig(batch_size=20000, device="cpu", progress=False)).fit()   # refused before a step
    with pytest.raises(ConfigError, match=r"^d_model: 4096 needs at least"):
        Trainer(RecallConfig(seq_len=64, d_model=4096, n_heads=2, n_layers=1, attention="sdpa"), run)
    def total(batch):
        return sum(trainer.memory_needs(task, RunConfig(batch_size=batch, device="cpu", progress=False)).values())
    per_row = (total(16) - total(8)) / 8
    big = RunConfig(batch_size=int((0.75 * 64 * 2**20 - total(8)) / per_row) + 8, device="cpu", progress=False)
    assert 32 * 2**20 < total(big.batch_size) < 64 * 2**20
    Trainer(task, big).check_memory()                     # fits alone …
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"per process, 2 processes\), more than the 64.0 MiB"):
        Trainer(task, big).check_memory()                 # … not twice
    # a trainer built only to hold a model (a notebook loading shipped weights) is not refused for a batch it
    # would never train: building it checks the weights alone
    held = Trainer(RecallConfig(seq_len=65536, d_model=32, n_heads=2, n_layers=1, attention="sdpa",
                                positions="rotary"), RunConfig(batch_size=32, device="cpu", progress=False))
    with pytest.raises(ConfigError, match=r"^seq_len: 65536 needs at least"):
        held.check_memory()
    assert memory.size(3 * 2**60) == "3.0 EiB" and memory.size(1536) == "1.5 KiB"


def test_an_empty_out_dir_is_refused(capsys):
    """Found by an audit: --out-dir "" trained, exited 0, wrote nothing and did not say so."""
    code, stdout, lines = _run([*TINY, "--steps", "1", "--out-dir", ""], capsys)
    _one_line(lines, 2, code, "--out-dir: '' is an empty path; give a directory")
    assert stdout == ""


# ---------------------------------------------------------------- the autotuner's cache
class _Kernel:
    def __init__(self):
        self.answer = torch.randn(8)

    def launch(self, config):
        return (self.answer,)

    @staticmethod
    def bench(fn):
        fn()
        return 1.0


A, B = autotune.Config(64, 64, 4, 2), autotune.Config(64, 32, 4, 2)
KEY = ("forward", "cuda:0", torch.bfloat16, 64, True, False, False, 1, 1024, 1024, 64)


def _choose(path):
    """The tuner's choice for KEY with a cache at ``path``: (config, warnings)."""
    kernel = _Kernel()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = autotune.Autotuner(bench=kernel.bench, cache_path=str(path)).choose(KEY, [A, B], kernel.launch)
    return chosen, [str(w.message) for w in caught if "cache" in str(w.message)]


def test_the_autotune_cache_survives_what_a_shared_machine_puts_there(tmp_path, monkeypatch):
    """Found by an audit: deeply nested JSON raised RecursionError out of the tuner; a file with a
    UTF-8 byte-order mark lost its decisions; the temporary name <cache>.<pid>.<tid>.tmp was
    predictable and opened with open(…, "w"), so a symlink planted there redirected the write into
    another file; a directory at the cache path left a temporary file per attempt."""
    monkeypatch.setenv("FLASHLAB_AUTOTUNE", "1")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    chosen, said = _choose(deep)
    assert chosen in (A, B) and any("nested too deep" in m for m in said), said
    assert isinstance(json.loads(deep.read_text()), dict)                    # rewritten with the decision

    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"k": "v"}).encode())
    assert autotune_cache.read_decisions(bom) == {"k": "v"}

    cache, victim = tmp_path / "cache.json", tmp_path / "victim.txt"
    victim.write_text("mine")
    for name in (f"cache.json.{os.getpid()}.0.tmp", ".cache.json.tmp", "cache.json.tmp"):
        (tmp_path / name).symlink_to(victim)                                  # every name a writer could predict
    autotune_cache.merge_decisions(cache, {"k": "v"})
    assert victim.read_text() == "mine" and not cache.is_symlink() and json.loads(cache.read_text()) == {"k": "v"}
    (tmp_path / "lock.json.lock").symlink_to(victim)                            # and at the lock's name: refused
    with pytest.raises(OSError):
        autotune_cache.merge_decisions(tmp_path / "lock.json", {"k": "v"})
    assert victim.read_text() == "mine"

    folder = tmp_path / "folder"
    (folder / "cache.json").mkdir(parents=True)
    for _ in range(3):
        chosen, said = _choose(folder / "cache.json")
        assert chosen in (A, B) and any("cannot read the cache" in m for m in said), said
    assert sorted(p.name for p in folder.iterdir()) == ["cache.json", "cache.json.lock"], "no stray temporary file"
    mode = 0o640
    os.chmod(cache, mode)                                   # a rewrite keeps the file's permissions
    autotune_cache.merge_decisions(cache, {"j": "w"})
    assert cache.stat().st_mode & 0o777 == mode


# ---------------------------------------------------------------- a checkpoint validated as a whole
def _tsp_model_variants(tmp_path):
    """A tsp-model checkpoint with a valid SHA-256 and one thing wrong: {what: (path, the line's words)}."""
    saved = checkpoint.load(TSP_MODEL)
    w = saved.state["model"]

    def variant(name, config=None, state=None):
        path = tmp_path / f"{name}.pt"
        checkpoint.save(path, "tsp-model", saved.config if config is None else config,
                        saved.state if state is None else state, saved.metadata)
        return str(path)
    damaged = "the file is damaged or was not written by flashlab"
    return {
        "an unknown model option": (variant("unknown", {**saved.config, "dropout": 0.1}),
                                    "'dropout' is no setting of the Attention Model"),
        "n_heads 0": (variant("heads0", {**saved.config, "n_heads": 0}), "n_heads: 0 is out of range"),
        "n_heads 7": (variant("heads7", {**saved.config, "n_heads": 7}), "n_heads: 7 does not divide d_model=128"),
        "embed_dim text": (variant("text", {**saved.config, "embed_dim": "128"}), "d_model: '128' is not an integer"),
        "no ff_dim": (variant("noff", {k: v for k, v in saved.config.items() if k != "ff_dim"}), "no ff_dim"),
        "a list for settings": (variant("list", [1, 2]), "a list where a dict of settings belongs"),
        "a missing weight": (variant("missing", state={"model": {k: v for k, v in w.items()
                                                                 if k != "project_out.weight"}}),
                             "project_out.weight missing"),
        "an extra weight": (variant("extra", state={"model": {**w, "x": torch.ones(1)}}), "x unexpected"),
        "a weight of another shape": (variant("shape", state={"model": {**w, "project_out.weight":
                                                                        w["project_out.weight"][:, :-1]}}),
                                      "has shape (128, 127) where the model its settings describe has (128, 128)"),
        "a weight not a tensor": (variant("list_w", state={"model": {**w, "init_embed.bias": [0.0] * 128}}),
                                  "init_embed.bias is a list, not a tensor"),
        "NaN weights": (variant("nan", state={"model": {**w, "layers.0.qkv.weight":
                                                        torch.full_like(w["layers.0.qkv.weight"], float("nan"))}}),
                        "layers.0.qkv.weight holds NaN or infinite values"),
        "an infinite weight": (variant("inf", state={"model": {**w, "init_embed.weight":
                                                               w["init_embed.weight"].clone().fill_(float("inf"))}}),
                               "init_embed.weight holds NaN or infinite values"),
        "no model in the state": (variant("nomodel", state={"weights": w}), "holds no model weights"),
    }, damaged


def test_eval_tsp_validates_a_checkpoint_as_a_whole(tmp_path, capsys):
    """Found by an audit: a checkpoint whose SHA-256 matched but whose settings or weights were wrong
    made eval-tsp print a traceback in 9 of 11 cases. Each is now one line naming --checkpoint."""
    variants, _ = _tsp_model_variants(tmp_path)
    for what, (path, words) in variants.items():
        code, stdout, lines = _run(["eval-tsp", "--checkpoint", path, "--instances", "2", "--attention", "sdpa"],
                                   capsys)
        _one_line(lines, 2, code, f"--checkpoint: {path}", words)
        assert stdout == "", what


def test_a_training_state_is_validated_before_resume_and_export(tmp_path, capsys):
    """Resume (train-tsp, train) and export-tsp: a setting no run can have, an unknown setting (was
    silently dropped on resume), NaN weights (were trained on, or exported as a NaN policy), a
    missing weight, a missing optimizer state, a broken baseline: one line each, naming the option
    that gave the file, nothing written."""
    out = tmp_path / "tsp"
    assert main([*TINY_TSP, "--steps", "2", "--out-dir", str(out)]) == 0
    saved = checkpoint.load(out / "checkpoint_last.pt")
    capsys.readouterr()

    drop = object()

    def variant(name, task=None, **state):
        path = tmp_path / f"{name}.pt"
        config = {**saved.config, "task": saved.config["task"] if task is None else task}
        new = {k: v for k, v in {**saved.state, **state}.items() if v is not drop}
        checkpoint.save(path, "tsp-training-state", config, new, saved.metadata)
        return str(path)
    model = saved.state["model"]
    nan = {k: v.clone().fill_(float("nan")) if v.is_floating_point() else v for k, v in model.items()}
    cases = [(variant("unknown", {**saved.config["task"], "dropout": 0.5}), "'dropout' is no setting of TSPConfig"),
             (variant("heads", {**saved.config["task"], "n_heads": 0}), "n_heads: 0 is out of range"),
             (variant("nan", model=nan), "holds NaN or infinite values"),
             (variant("missing", model={k: v for k, v in model.items() if k != "init_embed.bias"}),
              "init_embed.bias missing"),
             (variant("noopt", optimizer=drop), "cannot restore (KeyError: 'optimizer')"),
             (variant("nostep", step=drop), "holds no step count"),
             (variant("baseline", extra={"baseline": nan, "baseline_updates": 0}), "its baseline weight")]
    for path, words in cases:
        code, _, lines = _run(["train-tsp", "--resume", path, "--steps", "4", "--no-progress", "--out-dir",
                               str(tmp_path / "resumed")], capsys)
        _one_line(lines, 2, code, f"--resume: {path}", words)
        code, _, lines = _run(["export-tsp", "--checkpoint", path, "--out", str(tmp_path / "am.pt")], capsys)
        _one_line(lines, 2, code, f"--checkpoint: {path}", words)
    assert not (tmp_path / "resumed").exists() and not (tmp_path / "am.pt").exists()
    lm = tmp_path / "lm"
    assert main([*TINY, "--steps", "1", "--out-dir", str(lm)]) == 0
    lm_saved = checkpoint.load(lm / "checkpoint_last.pt")
    bad = tmp_path / "lm_bad.pt"
    checkpoint.save(bad, lm_saved.kind, {**lm_saved.config, "task": {**lm_saved.config["task"], "n_heads": 3}},
                    lm_saved.state, lm_saved.metadata)
    capsys.readouterr()
    code, _, lines = _run(["train", "--resume", str(bad), "--steps", "2", "--no-progress"], capsys)
    _one_line(lines, 2, code, f"--resume: {bad} holds task settings no run can have (n_heads: 3 does not divide "
                              f"d_model=16; pick a divisor); the file is damaged or was not written by flashlab.")


def test_a_flipped_bit_in_the_outer_archive_is_damage_not_an_attack(tmp_path):
    """Found by an audit: flips in the outer pickle, which the payload's SHA-256 does not cover, were
    reported as "could run code" (1,019 of the 2,720 single-bit flips of am_tsp20.pt's) or loaded (198).
    The archive's CRC-32s are now checked first: every flip of it is refused as corrupted, none as unsafe."""
    path = tmp_path / "c.pt"
    checkpoint.save(path, "tsp-model", {"embed_dim": 8}, {"w": torch.randn(4)})
    data = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
    header = data[info.header_offset:info.header_offset + 30]            # the local header's own lengths
    start = info.header_offset + 30 + int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little")
    said = {}
    for bit in range(start * 8, (start + info.compress_size) * 8, 3):      # every third bit of the pickle
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        (tmp_path / "d.pt").write_bytes(bytes(damaged))
        with pytest.raises(checkpoint.CheckpointError) as error:
            checkpoint.load(tmp_path / "d.pt")
        kind = "corrupted" if "corrupted" in str(error.value) else "other"
        assert "could run code" not in str(error.value), str(error.value)
        said[kind] = said.get(kind, 0) + 1
    assert said == {"corrupted": len(range(start * 8, (start + info.compress_size) * 8, 3))}, said


def test_convert_legacy_of_a_list_says_so_in_one_line(tmp_path):
    """Found by an audit: TypeError: pop expected at most 1 argument, got 2."""
    source = tmp_path / "list.pt"
    torch.save([1, 2, 3], source)
    with pytest.raises(checkpoint.CheckpointError, match=r"^checkpoint: .*list.pt holds a list, not the dict of "
                                                         r"tensors and settings of the first flashlab format; there "
                                                         r"is nothing to convert\.$"):
        checkpoint.convert_legacy(source, tmp_path / "new.pt", "tsp-model")
    assert not (tmp_path / "new.pt").exists()


def test_a_lock_file_naming_an_ended_process_is_not_taken_for_its_holder(tmp_path, monkeypatch):
    """Found by CI: a resume refused in the moment between another run taking the lock and writing
    its PID read a PID from the lock file that no longer ran. Such a PID of this host is read again
    for a moment (the holder writes its own just after taking the lock), then said as having ended."""
    import socket
    import subprocess
    import sys

    from flashlab.train import run_dir
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = f"process {int(ended.stdout)} on {socket.gethostname()}"
    alive = f"process {os.getpid()} on {socket.gethostname()}"
    assert run_dir._ended_here(dead) and not run_dir._ended_here(alive)
    assert not run_dir._ended_here("process 1 on another-host") and not run_dir._ended_here("garbage")
    lock = tmp_path / ".run.lock"
    lock.write_text(dead + "\n")
    monkeypatch.setattr(run_dir.time, "sleep", lambda s: None)
    assert run_dir._holder(lock) == dead + ", since ended"
    lock.write_text("")
    assert run_dir._holder(lock) == "a process that has not said its PID yet"
    lock.write_text(alive + "\n")
    assert run_dir._holder(lock) == alive
