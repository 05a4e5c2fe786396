"""pytest plugin for the course: which exercise implementation to test, and progress.

- ``--impl=exercises`` (default) or ``--impl=solutions``, or the environment variable
  ``FLASHLAB_IMPL``, chooses where the exercise tests import from.
- A test that hits ``NotImplementedError`` in your exercise is reported as "not
  started" (skipped), not as a crash.
- Every run ends with one progress line per exercise and a total.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parent
IMPLEMENTATIONS = ("exercises", "solutions")
_status: dict[str, list[str]] = {}


def pytest_addoption(parser):
    parser.addoption("--impl", choices=IMPLEMENTATIONS, default=None,
                     help="run exercise tests against exercises/ (default) or solutions/ "
                          "(also: FLASHLAB_IMPL=solutions)")


def selected_impl(config) -> str:
    impl = config.getoption("--impl") or os.environ.get("FLASHLAB_IMPL", "exercises")
    if impl not in IMPLEMENTATIONS:
        raise pytest.UsageError(f"FLASHLAB_IMPL={impl!r}: use one of {IMPLEMENTATIONS}.")
    return impl


def all_exercises() -> list[str]:
    return sorted(p.stem for p in (ROOT / "exercises").glob("ex*.py"))


def exercise_of(item) -> str | None:
    """test_ex01_naive_attention.py -> ex01_naive_attention."""
    stem = Path(str(item.fspath)).stem
    return stem[len("test_"):] if stem.startswith("test_ex") else None


@pytest.fixture
def exercise(request):
    """The exercise module under test, from exercises/ or solutions/ (see --impl)."""
    name = exercise_of(request.node)
    if name is None:
        raise pytest.UsageError("the `exercise` fixture is for tests/test_exNN_*.py files")
    module = importlib.import_module(f"{selected_impl(request.config)}.{name}")
    if not torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
        # CPU: the module's @triton.jit kernels run as their interpreted twins (flashlab sets
        # nothing process-wide, so a kernel launched as written would try to compile)
        from triton.runtime.jit import JITFunction

        from flashlab.runtime import kernel_for
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                setattr(module, attr, kernel_for(value, "cpu"))
    return module


def pytest_report_header(config):
    return f"flashlab exercises from: {selected_impl(config)}/"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    name = exercise_of(item)
    if name is None:
        return
    if call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError):
        report.outcome = "skipped"
        report.longrepr = (str(item.fspath), item.location[1] or 0,
                           f"not started: implement it in exercises/{name}.py")
        _status.setdefault(name, []).append("not started")
    elif report.when == "call" or report.outcome == "failed":
        if report.when == "call" and report.outcome == "skipped":
            return
        _status.setdefault(name, []).append(report.outcome)


def _summarise(outcomes: list[str]) -> str:
    if not outcomes:
        return "not run"
    if "failed" in outcomes:
        return "failed"
    if "not started" in outcomes:
        return "in progress" if "passed" in outcomes else "not started"
    return "passed"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    names = all_exercises()
    if not names:
        return
    tr = terminalreporter
    tr.section(f"exercise progress ({selected_impl(config)}/)")
    counts: dict[str, int] = {}
    for name in names:
        state = _summarise(_status.get(name, []))
        counts[state] = counts.get(state, 0) + 1
        tr.write_line(f"  {name:<32} {state}")
    line = (f"exercises: {counts.get('passed', 0)} passed, {counts.get('failed', 0)} failed, "
            f"{counts.get('not started', 0)} not started")
    for extra in ("in progress", "not run"):
        if counts.get(extra):
            line += f", {counts[extra]} {extra}"
    tr.write_line(line)
