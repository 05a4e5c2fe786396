"""Where the autotuner's decisions live between processes: a JSON file per user (written by
every process that tunes), and the decisions shipped with the package for the course's GPUs
(``flashlab/tuned/<gpu>.json``, read-only).

Both are plain JSON objects mapping a text key to a configuration's name (``str(Config)``).
A file is trusted for nothing: anything that is not such an object (a list, ``null``, a
number, garbage, JSON nested too deep to parse, a directory, an entry whose value is not a
string) is reported once in a warning and ignored, and the affected shapes are tuned again;
a UTF-8 byte-order mark (an editor's) is read past. Several processes (a data-parallel job,
two notebooks) may tune at once: each write takes an exclusive lock on a lock file beside
the cache, reads what the others wrote, adds its own decisions and replaces the file
atomically, as checkpoints are written: a temporary file of an unpredictable name created
exclusively in the same directory (``mkstemp``: a file or symlink planted there is never
written through), fsynced, then ``os.replace``; no decision is lost, no reader ever sees half
a file, and a failed write leaves no temporary file behind.

Standard library only, so the cache can be used (and tested across processes) without
importing torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import warnings
from pathlib import Path

try:  # POSIX; elsewhere writes are atomic but unlocked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

SHIPPED_DIR = Path(__file__).parent / "tuned"
FORMAT = 1                            # version of the shipped files' layout


def _warn(message: str) -> None:
    warnings.warn(f"flashlab autotune: {message}", RuntimeWarning, stacklevel=3)


def valid_decisions(data, source: str) -> dict[str, str]:
    """The ``{key: config name}`` entries of ``data`` (parsed JSON) that have the right types;
    warns (naming ``source``) about anything else and drops it."""
    if not isinstance(data, dict):
        _warn(f"{source} holds a JSON {type(data).__name__}, not an object of decisions: "
              "ignoring it and tuning again (delete the file to silence this)")
        return {}
    good = {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}
    if len(good) < len(data):
        _warn(f"{source}: ignoring {len(data) - len(good)} entries that are not text → text "
              "(those shapes are tuned again)")
    return good


def read_decisions(path: str | os.PathLike) -> dict[str, str]:
    """The valid decisions in the cache file at ``path``; {} when there is no file yet, and a
    warning (never an exception) when it cannot be read or parsed."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        _warn(f"cannot read the cache {path} ({exc}): tuning again")
        return {}
    try:
        data = json.loads(raw.decode("utf-8-sig"))       # -sig: a byte-order mark is read past
    except (ValueError, RecursionError) as exc:   # JSONDecodeError, UnicodeDecodeError (binary), nesting too deep
        reason = "nested too deep to parse" if isinstance(exc, RecursionError) else exc
        _warn(f"the cache {path} is not valid JSON ({reason}): ignoring it and tuning again "
              "(the next decision rewrites it)")
        return {}
    return valid_decisions(data, f"the cache {path}")


@contextlib.contextmanager
def _locked(path: str):
    """An exclusive lock held by this process on ``path``.lock (advisory: every flashlab
    writer takes it). The lock file is never deleted: deleting it would let two writers
    hold locks on two different files."""
    if fcntl is None:                 # pragma: no cover
        yield
        return
    # O_NOFOLLOW: a symlink planted at the lock's name is refused (OSError), not opened
    fd = os.open(f"{path}.lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0),
                 0o644)
    with open(fd, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def merge_decisions(path: str | os.PathLike, new: dict[str, str]) -> dict[str, str]:
    """Adds ``new`` to the cache file at ``path``: under the lock, read what is there (other
    processes' decisions included), update it with ``new``, write a temporary file and
    rename it over the cache. Returns everything the file now holds. Raises OSError if the
    directory cannot be written (the caller keeps its decisions in memory)."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with _locked(path):
        merged = read_decisions(path)
        merged.update(new)
        handle, partial = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                           dir=os.path.dirname(path))
        try:
            # the mode an open() would give, or the file's own (mkstemp's is 0600)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(partial, os.stat(path).st_mode & 0o777 if os.path.isfile(path) else 0o666 & ~umask)
            with open(handle, "w", encoding="utf-8") as f:
                json.dump(merged, f, indent=0, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)  # atomic: a reader sees the old file or the new one
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
            raise
    return merged


def gpu_slug(gpu_name: str) -> str:
    """File name of a GPU's shipped decisions: "NVIDIA H200" → "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def shipped_path(gpu_name: str) -> Path:
    return SHIPPED_DIR / f"{gpu_slug(gpu_name)}.json"


def read_shipped(gpu_name: str) -> dict[str, str]:
    """The decisions shipped for this GPU model, {} for a GPU the package has none for.
    A shipped file is {"format": 1, "gpu": name, ..., "decisions": {key: config}}; one
    for another GPU, another format or of the wrong shape is ignored with a warning."""
    path = shipped_path(gpu_name)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError, RecursionError) as exc:
        _warn(f"cannot read the shipped decisions {path} ({exc}): tuning instead")
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("gpu") != gpu_name:
        _warn(f"{path} is not a format-{FORMAT} file of decisions for {gpu_name!r}: tuning instead")
        return {}
    return valid_decisions(data.get("decisions"), str(path))
