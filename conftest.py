"""pytest plugin for the course: which exercise implementation to test, and progress.

- ``--impl=exercises`` (default) or ``--impl=solutions``, or the environment variable
  ``FLASHLAB_IMPL``, chooses where the exercise tests import from.
- A test that hits ``NotImplementedError`` in your exercise is reported as "not
  started" (skipped), not as a crash.
- Every run that includes exercise tests ends with a progress table. A run of every exercise's
  tests (``make progress``) prints one line per exercise and a total; a run of some of them
  (``make test-ex``) prints a line for each exercise it ran, then one line counting the others
  by their state after their last whole run (kept in pytest's cache). An exercise whose tests
  were only partly run (``-k``, ``::test_name``, ``-x`` stopping early) says so.
- Under pytest-xdist (``make test`` runs ``-n auto``): a notebook's cells go to one worker, in order; the table
  is built in the controller from the workers' reports; each worker takes its share of the cores.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parent
IMPLEMENTATIONS = ("exercises", "solutions")
WHOLE_TABLE_COMMAND = "make progress"

_outcome: dict[str, str] = {}          # test id -> passed / failed / not started / launcher written / skipped
_collected: dict[str, list[str]] = defaultdict(list)          # exercise -> test ids this run selected
_deselected: Counter = Counter()                              # exercise -> tests left out by -k / -m / --deselect
_hints: Counter = Counter()           # "hint: …" line of failed exercise tests -> how many tests printed it
_named_tests: set[str] = set()                                # exercises given as file::test on the command line


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


def _exercise_of_path(path) -> str | None:
    """tests/exercises/test_ex01_naive_attention.py -> ex01_naive_attention."""
    stem = Path(str(path)).stem
    return stem[len("test_"):] if re.match(r"test_ex\d", stem) else None


def exercise_of(item) -> str | None:
    return _exercise_of_path(item.fspath)


@pytest.fixture
def exercise(request):
    """The exercise module under test, from exercises/ or solutions/ (see --impl)."""
    name = exercise_of(request.node)
    if name is None:
        raise pytest.UsageError("the `exercise` fixture is for tests/exercises/test_exNN_*.py files")
    try:
        module = importlib.import_module(f"{selected_impl(request.config)}.{name}")
    except SyntaxError as error:            # one line per test, not importlib's frames around the same caret
        where = Path(error.filename or "").relative_to(Path(__file__).parent) if error.filename else name
        pytest.fail(f"{where}, line {error.lineno}: {type(error).__name__}: {error.msg}. Python cannot read the file "
                    f"until this is fixed: `python -m py_compile {where}` shows the line", pytrace=False)
    # new tensors the exercise allocates with torch.empty* hold a known value (tests.exercises.hints.UNWRITTEN), so a
    # kernel that stores nothing is named as such, not reported as a numerical error
    module.torch = _FilledAllocations()
    if not torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
        # CPU: the module's @triton.jit kernels run as their interpreted twins (flashlab sets
        # nothing process-wide, so a kernel launched as written would try to compile)
        from triton.runtime.jit import JITFunction

        from flashlab.launch.runtime import kernel_for
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                setattr(module, attr, kernel_for(value, "cpu"))
    from tests.exercises.hints import mark_unwritten_kernels
    mark_unwritten_kernels(module, name)         # a kernel still `pass`: "not started", not a wrong output
    return module


class _FilledAllocations:
    """An exercise module's ``torch``: the real module, except that ``empty``, ``empty_like`` and
    ``empty_strided`` fill new floating-point tensors with ``tests.exercises.hints.UNWRITTEN`` (their contents are
    undefined anyway, so a correct answer cannot tell), which the tests' hints look for."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def _filled(t):
        from tests.exercises.hints import UNWRITTEN
        if t.is_floating_point():
            with torch.no_grad():
                t.fill_(UNWRITTEN)
        return t

    def empty(self, *args, **kwargs):
        return self._filled(torch.empty(*args, **kwargs))

    def empty_like(self, *args, **kwargs):
        return self._filled(torch.empty_like(*args, **kwargs))

    def empty_strided(self, *args, **kwargs):
        return self._filled(torch.empty_strided(*args, **kwargs))


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests need a CUDA GPU (``gpu(capability=9)``: a Hopper one): without it
    they are skipped with the reason, so CI on a CPU reports them as skipped, never as failed.
    ``pytest -m gpu`` selects them on a GPU machine."""
    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        wanted = marker.kwargs.get("capability")
        if capability is None:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (this machine has none)"))
        elif wanted is not None and capability[0] != wanted:
            here = f"sm_{capability[0]}{capability[1]}"
            item.add_marker(pytest.mark.skip(reason=f"needs an sm_{wanted}0 GPU, this one is {here}"))


def pytest_report_header(config):
    return f"flashlab exercises from: {selected_impl(config)}/"


def _share_the_cores_between_workers():
    """Under pytest-xdist each worker (and each notebook kernel it starts, which inherits the environment) gets
    its share of the cores: PyTorch's default of one thread per core in every worker oversubscribes them (on the
    course's 2-core CI, make test took 446 s that way and 391 s with one thread each). OMP_NUM_THREADS, if set,
    wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // workers)))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_configure(config):
    _share_the_cores_between_workers()
    for arg in config.args:                     # "tests/exercises/test_ex03_online_softmax.py::test_merge…"
        path, sep, _ = str(arg).partition("::")
        name = _exercise_of_path(path)
        if sep and name:
            _named_tests.add(name)


def pytest_deselected(items):
    for item in items:
        name = exercise_of(item)
        if name:
            _deselected[name] += 1


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's default (--dist load) with one exception: a notebook's cells share one kernel, so they go
    to one worker together, in order. Notebooks (the largest units) are handed out first, single tests after."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class NotebookCellsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.partition("::")[0]
            return path if path.endswith(".ipynb") else nodeid

    return NotebookCellsTogether(config, log)


def pytest_collection_finish(session):
    for item in session.items:
        name = exercise_of(item)
        if name:
            _collected[name].append(item.nodeid)


# pytest-xdist (make test runs on one worker per core): the workers collect and run, the controller prints the
# table. It learns what each worker collected from the hook below, what -k/-m left out from the workers'
# output (pytest_testnodedown), and each outcome from the reports it receives (pytest_runtest_logreport).
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    for nodeid in ids:
        name = _exercise_of_path(nodeid.partition("::")[0])
        if name and nodeid not in _collected[name]:          # every worker collects the same tests
            _collected[name].append(nodeid)


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)    # set in an xdist worker only
    if workeroutput is not None:
        workeroutput["flashlab_deselected"] = dict(_deselected)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    for name, count in getattr(node, "workeroutput", {}).get("flashlab_deselected", {}).items():
        _deselected[name] = max(_deselected[name], count)   # each worker deselects the same tests


NOT_STARTED = ("flashlab", "not started")                    # marks a report in user_properties (xdist sends them)
LAUNCHER_WRITTEN = ("flashlab", "launcher written")           # … and its own code reached an unwritten kernel


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    name = exercise_of(item)
    if name is None:
        return
    if call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError):
        report.outcome = "skipped"
        reason = str(call.excinfo.value)
        report.longrepr = (str(item.fspath), item.location[1] or 0,
                           f"not started: {reason}" if "exercises/" in reason
                           else f"not started: implement it in exercises/{name}.py")
        report.user_properties.append(NOT_STARTED)
        if _launched_by_the_exercise(call.excinfo, name):
            report.user_properties.append(LAUNCHER_WRITTEN)


def _launched_by_the_exercise(excinfo, name: str) -> bool:
    """An unwritten kernel (tests.exercises.hints.KernelNotWritten) launched from the exercise's own code, its
    launcher: that much is written, so the exercise is in progress. Not when a test launched the
    kernel itself, nor for a launcher's own ``raise NotImplementedError``."""
    from tests.exercises.hints import KernelNotWritten
    if not excinfo.errisinstance(KernelNotWritten):
        return False
    if excinfo.value.launcher_written:          # set by a test that ran the learner's launcher to its end
        return True
    return any(Path(str(entry.path)).name == f"{name}.py" and Path(str(entry.path)).parent.name in IMPLEMENTATIONS
               for entry in excinfo.traceback)


def pytest_runtest_logreport(report):
    """Runs where the table is printed: in the one process, or in xdist's controller for the workers' reports."""
    if _exercise_of_path(report.nodeid.partition("::")[0]) is None:
        return
    if NOT_STARTED in report.user_properties:
        _outcome[report.nodeid] = "launcher written" if LAUNCHER_WRITTEN in report.user_properties else "not started"
    elif report.outcome == "failed":
        _outcome[report.nodeid] = "failed"                    # setup, call or teardown
        for hint in dict.fromkeys(re.findall(r"^(?:E\s+)?(hint: .*)$", report.longreprtext, re.M)):
            _hints[hint] += 1
    elif report.when == "call":
        _outcome.setdefault(report.nodeid, report.outcome)    # not over "not started"
    elif report.outcome == "skipped":                         # skipped in setup (e.g. needs a GPU)
        _outcome.setdefault(report.nodeid, "skipped")


def exercise_state(test_ids: list[str], outcomes: dict[str, str]) -> str:
    """passed / failed / in progress / not started / not run, from the outcomes of its tests."""
    seen = [outcomes[t] for t in test_ids if t in outcomes]
    if not seen:
        return "not run"
    if "failed" in seen:
        return "failed"
    if "launcher written" in seen:               # a test reached an unwritten kernel through the learner's code
        return "in progress"
    if "not started" in seen:
        return "in progress" if "passed" in seen else "not started"
    return "passed" if "passed" in seen else "skipped"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    names = all_exercises()
    if not names or not _collected:
        return                                  # a run without exercise tests prints no table
    tr = terminalreporter
    impl = selected_impl(config)
    if _hints:              # a mistake that fails many tests prints its hint in each: here each hint once
        tr.section("hints (each once)")
        for hint, tests in _hints.most_common():
            tr.write_line(f"  [{tests} failed test{'s' if tests > 1 else ''}] {hint}")
    tr.section(f"exercise progress ({impl}/)")
    # each exercise's state after its last whole run, kept in pytest's cache (.pytest_cache/), so that a
    # table of one exercise (make test-ex) still says where the others stood
    cache = getattr(config, "cache", None)                    # None under -p no:cacheprovider
    history = cache.get(f"flashlab/exercise_states/{impl}", {}) if cache is not None else {}
    states = {name: exercise_state(_collected.get(name, []), _outcome) for name in names}
    ran_here = [name for name in names if states[name] != "not run"]
    whole = len(ran_here) == len(names)             # else: rows for the exercises run, one line for the rest
    counts: Counter = Counter()
    partial = 0
    for name in names if whole else ran_here:
        ids = _collected.get(name, [])
        state = states[name]
        counts[state] += 1
        note = ""
        ran = sum(t in _outcome for t in ids)
        if _deselected[name] or name in _named_tests or ran < len(ids):
            partial += 1
            note = f"  (partial run: only {ran} of its tests ran)"
        else:
            history[name] = state
        tr.write_line(f"  {name:<32} {state}{note}")
    if cache is not None:
        cache.set(f"flashlab/exercise_states/{impl}", history)
    if not whole:
        tr.write_line(_others_line([name for name in names if name not in ran_here], history, bool(ran_here)))
        return
    line = (f"exercises: {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['not started']} not started")
    for extra in ("in progress", "skipped"):
        if counts[extra]:
            line += f", {counts[extra]} {extra}"
    tr.write_line(line)
    if partial:
        tr.write_line(f"(this run did not include every exercise's tests: `{WHOLE_TABLE_COMMAND}` runs them all)")


def _others_line(others: list[str], history: dict[str, str], after_rows: bool) -> str:
    """One line for the exercises a run left out, counted by their state after their last whole run, e.g.
    "other exercises (last whole run): 3 passed, 12 not started — `make progress` for the whole table"."""
    remembered = Counter(history[name] for name in others if name in history)
    unknown = len(others) - sum(remembered.values())
    label = "other exercises" if after_rows else "exercises"
    order = ["passed", "failed", "in progress", "not started", "skipped"]
    parts = [f"{remembered[state]} {state}" for state in order + sorted(set(remembered) - set(order))
             if remembered[state]]
    if parts:
        label += " (last whole run)"
        if unknown:
            parts.append(f"{unknown} not run yet")
    else:
        parts.append(f"{unknown} not run (no whole run recorded)")
    return f"{label}: {', '.join(parts)} — `{WHOLE_TABLE_COMMAND}` for the whole table"
