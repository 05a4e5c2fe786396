"""Checkpoints you can trust: tensors and plain data only, written atomically, verified on load.

A checkpoint file is what ``torch.save`` writes, holding one dict of tensors and plain
Python data (no classes, no functions), so that ``torch.load(..., weights_only=True)``
reads it. A file that holds anything else is refused before any of it runs: an ordinary
pickle can run arbitrary code while it loads.

    {"format": "flashlab-checkpoint", "version": 1, "kind": "lm-training-state" | …,
     "sha256": hex digest of payload, "payload": uint8 tensor}

``payload`` is itself a ``torch.save`` archive of ``{"config", "state", "metadata"}``: the
digest covers every byte of it, so a flipped bit anywhere in the weights, the optimizer
state or the config is found at load time and the file refused, never trained on.

Saving writes a temporary file in the target's directory, flushes and fsyncs it, and
renames it over the target with ``os.replace`` (atomic on POSIX and Windows): a process
killed at any moment leaves either the previous complete checkpoint or the new one, never
a torn file. The temporary file's name carries the writer's process id, so that cleaning up
after a killed writer never deletes the file another live process is writing.

Loading checks the outer zip archive's CRC-32s before unpickling anything: a flipped bit in
its pickle is damage, and is reported as such, not as an object that could run code.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import tempfile
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

FORMAT = "flashlab-checkpoint"
VERSION = 1
KINDS = {      # what each kind holds, said when a file of another kind is given: a phrase without parentheses
    "lm-training-state": "a run of `python -m flashlab train` on associative recall, to continue with --resume",
    "lm-model": "a language model's weights and configuration",
    "tsp-model": "a TSP Attention Model's weights and architecture, which eval-tsp reads",
    "tsp-training-state": "a run of `python -m flashlab train-tsp`, with its baseline, to continue with --resume",
    "documents-training-state": "a run of `python -m flashlab train --task documents`, to continue with --resume",
}
# (found, wanted): how to get a usable file from the one given
CONVERSIONS = {
    ("tsp-training-state", "tsp-model"): "write its policy first with `python -m flashlab export-tsp --checkpoint "
                                         "{path} --out model.pt`, then evaluate model.pt",
    ("tsp-model", "tsp-training-state"): "give a run's OUT_DIR/checkpoint_last.pt or checkpoint_<step>.pt instead, "
                                         "as this file is evaluated as it is by eval-tsp",
    ("lm-training-state", "documents-training-state"): "resume it without --task documents, or start a documents run "
                                                       "without --resume",
    ("documents-training-state", "lm-training-state"): "resume it with --task documents",
}
# How a file torch.save wrote begins: a zip archive (PyTorch ≥ 1.6), or a pickle of protocol ≥ 2
# (the legacy format). A file that begins otherwise is not a checkpoint at all: refused unread.
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTOCOLS = tuple(bytes([0x80, p]) for p in range(2, 6))
WRITE_CHUNK = 1 << 20          # bytes per write() call while saving


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, unsafe, torn, corrupted, or of the wrong kind.
    The message starts with ``checkpoint:`` and says what to do instead."""


@dataclass
class Checkpoint:
    kind: str
    config: dict
    state: dict
    metadata: dict = field(default_factory=dict)
    version: int = VERSION


_PLAIN = (str, int, float, bool, type(None))


def _check_plain(value, where: str, tensors: bool) -> None:
    """Raise TypeError unless ``value`` is built from dicts, lists, tuples, primitives (and,
    where allowed, tensors) only: what ``weights_only=True`` can read back."""
    if isinstance(value, _PLAIN) or (tensors and isinstance(value, torch.Tensor)):
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"{where}: key {k!r} is a {type(k).__name__}; use str or int keys.")
            _check_plain(v, f"{where}[{k!r}]", tensors)
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]", tensors)
        return
    raise TypeError(f"{where}: a {type(value).__name__} cannot go into a checkpoint (tensors, dicts, lists, "
                    f"str, int, float, bool and None only); convert it to plain data first.")


def _serialize(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def encode(kind: str, config: dict, state: dict, metadata: dict | None = None) -> bytes:
    """The bytes of a checkpoint file (see the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {sorted(KINDS)}.")
    metadata = metadata or {}
    _check_plain(config, "config", tensors=False)
    _check_plain(metadata, "metadata", tensors=False)
    _check_plain(state, "state", tensors=True)
    payload = _serialize({"config": config, "state": state, "metadata": metadata})
    return _serialize({"format": FORMAT, "version": VERSION, "kind": kind,
                       "sha256": hashlib.sha256(payload).hexdigest(),
                       "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8)})


def write_atomically(path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash at any moment leaves the old file or the new
    one: a temporary file in the same directory (same file system, so the rename is atomic),
    flushed and fsynced, then ``os.replace``; the directory is fsynced so the rename itself
    survives a power cut."""
    path = Path(path)
    directory = path.parent
    remove_interrupted_writes(directory, path.name)
    # the writer's pid in the name: `remove_interrupted_writes` leaves a live writer's file alone
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=directory)
    try:
        os.chmod(temporary, _file_mode(path))                         # mkstemp's 0600 → what open() would give
        with open(handle, "wb") as f:
            view = memoryview(data)
            for start in range(0, len(view), WRITE_CHUNK):
                f.write(view[start:start + WRITE_CHUNK])
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    if hasattr(os, "O_DIRECTORY"):                                   # POSIX: make the rename durable
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_interrupted_writes(directory, name: str = "*") -> None:
    """Delete the temporary files that `write_atomically` left in ``directory`` for files named
    ``name`` (a glob pattern) when a process was killed mid-save; a file whose writer (the
    process id in its name) is still alive is being written, and stays."""
    for stale in Path(directory).glob(f".{name}.*.tmp"):
        writer = _writer_of(stale.name)
        if writer is not None and writer != os.getpid() and _alive(writer):
            continue
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()


def _writer_of(name: str) -> int | None:
    """The process id in a temporary file's name (``.<target>.<pid>.<random>.tmp``), or None for a
    name without one."""
    parts = name.removesuffix(".tmp").rsplit(".", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:              # another user's live process
        return True
    except (OverflowError, OSError):     # not a process id this system can have
        return False
    return True


def _file_mode(path: Path) -> int:
    """The permission bits the file should get: the existing file's, else 0666 less the umask."""
    if path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def save(paths, kind: str, config: dict, state: dict, metadata: dict | None = None) -> None:
    """Save a checkpoint of ``kind`` to ``paths`` (one path, or several that get the same
    bytes), each atomically. ``config`` and ``metadata``: plain data; ``state``: tensors
    and plain data."""
    data = encode(kind, config, state, metadata)
    for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        write_atomically(path, data)


def _unsafe_reason(exc: Exception) -> str:
    text = str(exc)
    for line in text.splitlines():
        if "Unsupported global" in line or "Unsupported operand" in line or "unsupported" in line.lower():
            return line.strip().rstrip(".")
    return text.splitlines()[0] if text else type(exc).__name__


def _not_a_checkpoint(path, why: str) -> CheckpointError:
    return CheckpointError(f"checkpoint: {path} is not a PyTorch checkpoint ({why}); give the path of a .pt file "
                           f"written by flashlab.")


def _check_torch_file(path) -> bytes:
    """Refuse, unread, a file that torch.save cannot have written (a README, an image …): its
    load would fail inside the unpickler with a message about unsafe objects, which is wrong.
    Returns the file's first bytes."""
    with open(path, "rb") as f:
        head = f.read(16)
    # empty: left to torch.load, whose EOFError says "cut short", the likely story of an empty .pt
    if head and not head.startswith((_ZIP_MAGIC, *_PICKLE_PROTOCOLS)):
        raise _not_a_checkpoint(path, f"not a torch.save zip archive: it starts with {head!r}")
    return head


def _check_archive(path) -> None:
    """The zip archive's own checksums (a CRC-32 per member, written by torch.save): a flipped
    bit in the outer pickle, which the payload's SHA-256 does not cover, is found here and called
    damage, before the unpickler could take it for an object it refuses as unsafe."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except OSError:
        raise
    except Exception as exc:             # a damaged directory fails in many ways (BadZipFile, zlib, struct …)
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"checkpoint: {path} is not a complete checkpoint file ({first}); it was probably cut "
                              f"short or corrupted: resume from an earlier one.") from None
    if damaged is not None:
        raise CheckpointError(f"checkpoint: {path} is corrupted: its member {damaged} does not match the CRC-32 "
                              f"recorded when it was saved; refused. Resume from an earlier checkpoint.")


def _torch_load(source, path, map_location):
    if isinstance(source, (str, os.PathLike)):
        if _check_torch_file(source).startswith(_ZIP_MAGIC):
            _check_archive(source)
    try:
        with warnings.catch_warnings():
            # a raw pickle (not torch.save's zip) makes torch warn about its protocol before failing; the
            # one line below says what the file is
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" in str(exc) or "weights_only" in str(exc):
            raise CheckpointError(
                f"checkpoint: {path} holds objects other than tensors and plain data ({_unsafe_reason(exc)}), so "
                f"loading it could run code; refused. Load only checkpoints written by flashlab.train.checkpoint.save."
            ) from None
        raise CheckpointError(f"checkpoint: {path} is not a readable checkpoint ({exc}); it may be torn or "
                              f"corrupted: resume from an earlier one.") from None
    except Exception as exc:             # a damaged archive fails in many ways (RuntimeError, EOFError, TypeError …)
        if "Invalid magic number" in str(exc):        # a pickle of plain data, but not torch.save's
            raise _not_a_checkpoint(path, "a pickle that torch.save did not write") from None
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"checkpoint: {path} is not a complete checkpoint file ({first}); it was probably "
                              f"cut short or corrupted: resume from an earlier one.") from None


def _a(kind: str) -> str:
    return f"{'an' if kind[0] in 'aeiou' or kind.startswith('lm') else 'a'} {kind} checkpoint"


def _wrong_kind(path, found: str, wanted: tuple[str, ...]) -> str:
    """One sentence: what the file is, what is needed, and how to get it where a command can."""
    needs = " or ".join(f"{_a(k)}, {KINDS[k]}" for k in wanted)
    text = f"checkpoint: {path} is {_a(found)}, {KINDS[found]}; this needs {needs}"
    hint = next((CONVERSIONS[found, k] for k in wanted if (found, k) in CONVERSIONS), None)
    return f"{text}; {hint.format(path=path)}." if hint else f"{text}."


def load(path, kind: str | tuple[str, ...] | None = None, map_location="cpu") -> Checkpoint:
    """Read and verify a checkpoint (``weights_only=True``; SHA-256 of the payload).
    ``kind``: the kind (or kinds) the caller can use; any other is refused with a message
    that says what the file is. Raises `CheckpointError` on any problem."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint: {path} does not exist (or is not a file); give the path of a .pt file "
                              f"written by flashlab.")
    try:
        outer = _torch_load(str(path), path, "cpu")
    except OSError as exc:
        raise CheckpointError(f"checkpoint: cannot read {path} ({exc.strerror or exc}); give a checkpoint you can "
                              f"read.") from None
    if not isinstance(outer, dict) or outer.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint: {path} is not a flashlab checkpoint (no format marker; written by an "
                              f"older flashlab or another program). Convert a trusted old file with "
                              f"flashlab.train.checkpoint.convert_legacy.")
    if not isinstance(outer.get("version"), int) or outer["version"] > VERSION:
        raise CheckpointError(f"checkpoint: {path} has format version {outer.get('version')!r}; this flashlab reads "
                              f"versions ≤ {VERSION}. Upgrade flashlab.")
    found = outer.get("kind")
    if found not in KINDS:
        # the kind sits outside the hashed payload: a damaged key or value must not pass as "no kind"
        raise CheckpointError(f"checkpoint: {path} names no known kind ({found!r}); the file is damaged or was "
                              f"written by a newer flashlab: resume from an earlier one.")
    wanted = (kind,) if isinstance(kind, str) else kind
    if wanted is not None and found not in wanted:
        raise CheckpointError(_wrong_kind(path, found, wanted))
    payload = outer.get("payload")
    if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8:
        raise CheckpointError(f"checkpoint: {path} has no payload; the file is damaged: resume from an earlier one.")
    data = payload.numpy().tobytes()
    if hashlib.sha256(data).hexdigest() != outer.get("sha256"):
        raise CheckpointError(f"checkpoint: {path} is corrupted: its contents do not match the SHA-256 recorded when "
                              f"it was saved; refused. Resume from an earlier checkpoint.")
    inner = _torch_load(io.BytesIO(data), path, map_location)
    if not isinstance(inner, dict) or not {"config", "state"} <= inner.keys():
        raise CheckpointError(f"checkpoint: {path} has no config or state; the file is damaged: resume from an "
                              f"earlier one.")
    return Checkpoint(found, inner["config"], inner["state"], inner.get("metadata", {}), outer["version"])


def verify(path) -> str:
    """The kind of a valid checkpoint; raises `CheckpointError` otherwise."""
    return load(path).kind


def convert_legacy(source, target, kind: str, split_config=None) -> None:
    """Rewrite a checkpoint of the first flashlab format (a plain dict from ``torch.save``)
    in this format. Reads with ``weights_only=True`` too: a file that needs more is not
    converted. ``split_config``: a function from the old config dict to the new one."""
    old = _torch_load(str(source), Path(source), "cpu")
    if isinstance(old, dict) and old.get("format") == FORMAT:
        raise CheckpointError(f"checkpoint: {source} is in this format already (kind {old.get('kind')!r}); load it "
                              f"as it is.")
    if not isinstance(old, dict):
        raise CheckpointError(f"checkpoint: {source} holds a {type(old).__name__}, not the dict of tensors and "
                              f"settings of the first flashlab format; there is nothing to convert.")
    config = old.pop("config", {})
    metadata = old.pop("metadata", {})
    save(target, kind, split_config(config) if split_config else config, old, metadata)


def check_weights(path, what: str, saved, module: torch.nn.Module) -> None:
    """Raise `CheckpointError` unless ``saved`` (a checkpoint's state dict for ``what``, e.g. "model")
    has exactly ``module``'s keys, each a tensor of the module's shape, every floating-point one
    finite: what ``load_state_dict`` would otherwise fail on in many lines, or accept (NaN)."""
    expected = module.state_dict()
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint: {path} holds no {what} weights (a {type(saved).__name__} where a dict of "
                              f"tensors belongs); the file is damaged or was not written by flashlab.")
    missing = [k for k in expected if k not in saved]
    unexpected = [str(k) for k in saved if k not in expected]
    if missing or unexpected:
        first = f"{missing[0]} missing" if missing else f"{unexpected[0]} unexpected"
        more = len(missing) + len(unexpected) - 1
        raise CheckpointError(f"checkpoint: {path}: its {what} weights do not fit the model its settings describe "
                              f"({first}{f', and {more} more differences' if more else ''}); the file is damaged "
                              f"or was not written by flashlab.")
    for name, value in saved.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"checkpoint: {path}: its {what} weight {name} is a {type(value).__name__}, not a "
                                  f"tensor; the file is damaged or was not written by flashlab.")
        if value.shape != expected[name].shape:
            raise CheckpointError(f"checkpoint: {path}: its {what} weight {name} has shape {tuple(value.shape)} where "
                                  f"the model its settings describe has {tuple(expected[name].shape)}; the file is "
                                  f"damaged or was not written by flashlab.")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"checkpoint: {path}: its {what} weight {name} holds NaN or infinite values (the "
                                  f"run that saved it had diverged); refused. Resume from an earlier checkpoint.")
