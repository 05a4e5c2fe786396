"""A measurement suite, declared once: its name, what it measures and at which shapes, the time it
needs, the record it writes, where it can run, and the function that runs it (`Suite`); and what
that function is handed while it runs (`Context`): the device, the quick flag, the time left, the
record being built and where it is saved.

A suite's function fills ``ctx.record`` and calls ``ctx.save()`` after each piece of work, so that
a run stopped at its time limit keeps what it measured; it checks ``ctx.over()`` before starting a
piece, and records what it left out for want of time. `flashlab.bench.runner` runs suites."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from flashlab.launch.timing import Stopwatch

# where a suite can run: "gpu" needs a CUDA GPU; "gpu, or quick" runs its tiny --quick shapes on a
# CPU too (a check that the code runs; its times mean nothing there); "any" measures where it runs
NEEDS = ("gpu", "gpu, or quick", "any")


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str                   # what `python -m flashlab.bench run` takes
    summary: str                # one line, for `list` and --help
    measures: str               # what it measures, and against what
    shapes: str                 # its shapes (and --quick's)
    budget_s: float             # the time it needs at its full shapes
    run: Callable[[Context], None]
    needs: str = "gpu"          # one of NEEDS
    record: str = ""            # the record's name: results/<gpu>/<record>.json; the suite's name if empty
    min_s: float = 20.0         # with less time left than this it is skipped, not started
    on_cpu_record: bool = False  # it measures the host: its record goes under cpu/ on any machine
    requires: tuple[str, ...] = ()  # Python packages it needs beyond flashlab's own

    def __post_init__(self):
        if self.needs not in NEEDS:
            raise ValueError(f"Suite {self.name}: needs={self.needs!r}; choose one of {NEEDS}")
        if not self.record:
            object.__setattr__(self, "record", self.name)

    def refusal(self, has_gpu: bool, quick: bool) -> str | None:
        """Why this machine cannot run the suite (one line), or None."""
        missing = [name for name in self.requires if importlib.util.find_spec(name) is None]
        if missing:
            return f"{self.name}: needs the Python package {', '.join(missing)}, not installed here; skipped"
        if has_gpu or self.needs == "any" or (self.needs == "gpu, or quick" and quick):
            return None
        if self.needs == "gpu, or quick":
            return f"{self.name}: needs a CUDA GPU (on a CPU only its --quick shapes run); skipped"
        return f"{self.name}: needs a CUDA GPU; skipped"


def device_slug(gpu_name: str | None) -> str:
    """A short folder name for a device: "h100", "h200", "a100" from NVIDIA's names, "cpu" without one."""
    if not gpu_name:
        return "cpu"
    model = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", gpu_name.upper().replace("NVIDIA", ""))
    if model:
        return model.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "gpu"


class Context:
    """What a suite's function gets: ``device`` ("cuda" or "cpu"), ``quick``, the time left
    (`left_s`, `over`), ``record`` (a dict, started with the environment and the command) saved
    to ``path`` by `save`, ``files`` (a folder for files beside the record, made on first use)
    and `log` (one line to the suite's log)."""

    def __init__(self, suite: Suite, device: str, quick: bool, budget_s: float, path: Path, record: dict):
        self.suite, self.device, self.quick, self.budget_s = suite, device, quick, budget_s
        self.path, self.record = Path(path), record
        self.watch = Stopwatch()

    def left_s(self) -> float:
        return self.budget_s - self.watch.seconds()

    def over(self) -> bool:
        return self.left_s() <= 0

    @property
    def files(self) -> Path:
        folder = self.path.with_suffix("")
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def save(self) -> None:
        """The record as it stands, written whole (a kill mid-write leaves the previous one)."""
        self.record["seconds"] = round(self.watch.seconds(), 1)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.record, indent=1, default=str) + "\n")
        os.replace(tmp, self.path)

    def log(self, message: str) -> None:
        print(f"[{self.suite.name} {self.watch.seconds():6.1f} s] {message}", file=sys.stdout, flush=True)

    def skipped(self) -> str:
        """The words a record uses for what the time budget left out."""
        return f"skipped: the time budget of {self.budget_s:.0f} s was spent"
