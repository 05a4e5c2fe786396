"""A run's directory on a machine that other runs share: one run writes it at a time, the newest
complete checkpoint in it can be found, and a failure to write it ends the run in one line.

- `hold`: an advisory lock (``flock``) on ``OUT_DIR/.run.lock``, held for the run's life. The
  operating system releases it when the process ends, however it ends, so a SIGKILLed run never
  blocks the next one. A second run, or a second resume, into a held directory is refused in one
  line that names the process holding it. Under torchrun only rank 0 writes, and only rank 0
  takes the lock (`flashlab.train.trainer.Trainer.hold_out_dir` tells the other ranks the outcome).
- `newest_checkpoint`: the newest checkpoint in a directory that loads and verifies, for
  ``--resume auto`` and for a run whose last save was cut short.
- `RunFilesError` and `files_failed`: a full or read-only disk, a permission or an I/O error while
  writing a run's files becomes one line that says what failed, which checkpoint is the last good
  one and the command that resumes from it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import time
from pathlib import Path

from . import checkpoint
from .config import ConfigError

try:  # POSIX; elsewhere runs are not kept apart
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK_NAME = ".run.lock"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# directory (resolved) → [descriptor of its lock file, holders in this process, the first directory `hold`
# created (removed again if the run leaves nothing in it) or None]
_held: dict[str, list] = {}


def _holder(lock: Path) -> str:
    """Who holds ``lock``, as its holder wrote it ("process 1234 on host"). The holder writes it
    just after taking the lock, so for a moment the file is empty or still names the run before
    (a process of this host that has ended): such a text is read again for a moment, then said
    as it is, with "since ended"."""
    last = ""
    for _ in range(40):
        with contextlib.suppress(OSError):
            last = lock.read_text().strip() or last
            if last and not _ended_here(last):
                return last
        time.sleep(0.05)
    # a run that held it for a moment (and was refused itself) may have ended since
    return f"{last}, since ended" if last else "a process that has not said its PID yet"


def _ended_here(holder: str) -> bool:
    """Whether ``holder`` ("process 1234 on host") names a process of this host that no longer runs."""
    words = holder.split()
    if len(words) != 4 or words[0] != "process" or not words[1].isdigit() or words[3] != socket.gethostname():
        return False
    try:
        os.kill(int(words[1]), 0)
    except ProcessLookupError:
        return True
    except OSError:                        # alive, someone else's
        return False
    return False


def hold(out_dir) -> None:
    """Take ``out_dir`` (created if missing) for this process, until `release`; raise
    `ConfigError` on ``out_dir`` if another process holds it, or if its lock file cannot be made.
    Taking it again in the same process only counts (a command and its Trainer both take it)."""
    directory = Path(out_dir)
    key = str(directory.resolve())
    if key in _held:
        _held[key][1] += 1
        return
    lock = directory / LOCK_NAME
    created = next((p for p in reversed([directory.absolute(), *directory.absolute().parents]) if not p.exists()),
                   None)
    for _ in range(10):
        fd = _lock_file(lock)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ConfigError("out_dir", f"{out_dir} is in use by another run ({_holder(lock)}, which holds "
                                             f"{lock}); wait for it to end, or give another directory.") from None
            except OSError as exc:         # a file system without locks (some network mounts): said, not fatal
                print(f"out_dir: cannot lock {lock} ({exc.strerror or exc}); nothing keeps a second run out of "
                      f"{out_dir} while this one runs.", file=sys.stderr, flush=True)
        # a run that made the directory and left nothing in it removes it again (`release`): the file locked
        # here must still be the one at the lock's name, or another run could lock a new one beside it
        try:
            locked, there = os.fstat(fd), os.stat(lock, follow_symlinks=False)
            if (locked.st_dev, locked.st_ino) == (there.st_dev, there.st_ino):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    else:
        raise ConfigError("out_dir", f"{lock} was replaced each time this run locked it; another program is removing "
                                     f"it: stop that, or give another directory.")
    with contextlib.suppress(OSError):     # who holds it, for the line a refused run prints
        said = os.open(lock, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC | _NOFOLLOW)
        try:
            os.write(said, f"process {os.getpid()} on {socket.gethostname()}\n".encode())
        finally:
            os.close(said)                 # flock belongs to the descriptor above: this close keeps it
    _held[key] = [fd, 1, created]


def _lock_file(lock: Path) -> int:
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        # read-only, so that holding it never keeps the file system from being remounted read-only;
        # O_NOFOLLOW: a symlink planted at the lock's name is refused, not followed
        return os.open(lock, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | _NOFOLLOW, 0o644)
    except OSError as exc:
        raise ConfigError("out_dir", f"cannot create the lock file {lock} ({exc.strerror or exc}); give a directory "
                                     f"you can write to.") from None


def release(out_dir) -> None:
    """Give back one `hold` of ``out_dir``; the last one unlocks it. The lock file stays (a run
    that holds it next locks the same file), except in a directory `hold` made for a run that was
    refused before it wrote anything: that directory is removed again, lock file and all."""
    key = str(Path(out_dir).resolve())
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] > 0:
        return
    del _held[key]
    fd, _, created = entry
    if created is not None:
        directory = Path(key)
        with contextlib.suppress(OSError):
            if os.listdir(directory) == [LOCK_NAME]:
                os.unlink(directory / LOCK_NAME)            # while still locked: no one else holds this file
                for empty in (directory, *directory.parents):
                    os.rmdir(empty)
                    if empty == Path(created).resolve():
                        break
    os.close(fd)


def release_all() -> None:
    """Give back every directory this process holds (a command returning to its caller)."""
    for key in list(_held):
        _held[key][1] = 1
        release(key)


def newest_checkpoint(out_dir, kind=None) -> tuple[Path, int] | None:
    """(path, step) of the newest checkpoint in ``out_dir`` that loads and verifies (of ``kind``,
    if given), checkpoint_last.pt where it is as new as any; None if there is none. A save cut
    short by a kill leaves the previous file or none, never a torn one, but a file damaged since is
    passed over for the next newest."""
    out = Path(out_dir)
    best = None
    last = out / "checkpoint_last.pt"
    if last.is_file():
        with contextlib.suppress(checkpoint.CheckpointError):
            step = checkpoint.load(last, kind=kind).state.get("step")
            if isinstance(step, int):
                best = (last, step)
    numbered = []
    for path in out.glob("checkpoint_*.pt"):
        name = path.stem.removeprefix("checkpoint_")
        if name.isdigit():
            numbered.append((int(name), path))
    for step, path in sorted(numbered, reverse=True):
        if best is not None and step <= best[1]:
            break
        with contextlib.suppress(checkpoint.CheckpointError):
            saved_step = checkpoint.load(path, kind=kind).state.get("step")
            if isinstance(saved_step, int):
                return path, saved_step
    return best


class RunFilesError(OSError):
    """Writing a run's files failed (a full or read-only disk, a permission, an I/O error). The
    message is one line: what failed, the last good checkpoint, and the command that resumes;
    ``errno`` is the failure's."""

    def __str__(self) -> str:
        return self.args[0]


# what to do about each failure before resuming
_REMEDY = {errno.ENOSPC: "free some space there", errno.EDQUOT: "free some of your disk quota",
           errno.EROFS: "make that file system writable again (or copy the run to one that is)",
           errno.EACCES: "give yourself write permission there", errno.EPERM: "give yourself write permission there",
           errno.EIO: "check the disk (the system log says more)"}


def files_failed(what: str, exc: OSError, last_good: tuple[Path, int] | None, resume: str | None,
                 out_dir=None) -> RunFilesError:
    """The one-line error for ``exc`` raised while ``what`` ("saving …/checkpoint_4.pt"): the
    reason, ``last_good`` (path, step) and ``resume``, the arguments of ``python -m flashlab`` that
    continue from it (None: the run had trained every step); with no checkpoint, how to start again
    (``out_dir``: the run's directory)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    remedy = _REMEDY.get(exc.errno, "fix that")
    if last_good is None:
        where = f" (delete {out_dir} first, or give another --out-dir)" if out_dir else ""
        said = (f"{what} failed: {reason}; no checkpoint of this run was saved, so nothing can be resumed: "
                f"{remedy}, then start the run again{where}.")
    elif resume is None:
        path, step = last_good
        said = (f"{what} failed: {reason}; the run had trained every step, and its final state is saved in {path} "
                f"(step {step}): {remedy} before using this directory again.")
    else:
        path, step = last_good
        said = (f"{what} failed: {reason}; the last good checkpoint is {path} (step {step}): {remedy}, then "
                f"resume with: python -m flashlab {resume}")
    error = RunFilesError(said)
    error.errno = exc.errno
    return error
