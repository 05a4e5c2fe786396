"""gpu-tests: the test suite on the GPU: every test marked ``gpu`` (``pytest -m gpu``), and all of
tests/kernels, tests/api and tests/launch, whose other tests run the kernels compiled there too.
The record holds pass, fail, skip and error counts per pytest command and each failure's line;
pytest's output is in the log. A command still running when the budget ends is interrupted, so
that pytest prints the summary of what ran (its record says so)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from flashlab.bench.suite import Context, Suite

ROLES = ["tests/kernels", "tests/api", "tests/launch"]
COMMANDS = [ROLES, ["-m", "gpu", "tests", *(f"--ignore={role}" for role in ROLES)]]
QUICK = [["-m", "gpu", "tests/launch/test_timing.py"]]
COUNTS = ("passed", "failed", "skipped", "errors", "xfailed", "xpassed", "deselected")


def workers() -> list[str]:
    """pytest-xdist's options for up to 8 workers, if it is installed."""
    try:
        import xdist  # noqa: F401
    except ImportError:
        return []
    return ["-n", str(min(8, os.cpu_count() or 1))]


def summary(output: str) -> dict:
    """Counts from pytest's last summary line ("3 failed, 120 passed, 2 skipped in 40.1s") and the
    FAILED/ERROR lines of -rfE."""
    counts = {name: 0 for name in COUNTS}
    lines = [line for line in output.splitlines() if re.search(r"\b(passed|failed|error|errors|skipped)\b", line)
             and re.search(r" in [\d.]+s", line)]
    if lines:
        for number, name in re.findall(r"(\d+) (\w+)", lines[-1]):
            name = "errors" if name == "error" else name
            if name in counts:
                counts[name] = int(number)
    counts["summary"] = lines[-1].strip("= ") if lines else None
    counts["failures"] = [line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return counts


def run_pytest(args: list[str], seconds: float) -> tuple[str, bool]:
    """pytest's output, and whether it was interrupted at ``seconds`` (SIGINT: it prints its summary)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE", "--tb=short",
           *workers(), *args]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = child.communicate(timeout=max(1.0, seconds))
        return output, False
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGINT)
        try:
            output, _ = child.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            output, _ = child.communicate()
        return output, True


def run(ctx: Context) -> None:
    ctx.record["runs"] = []
    for args in (QUICK if ctx.quick else COMMANDS):
        if ctx.over():
            ctx.record["runs"].append({"args": args, "skipped": ctx.skipped()})
            continue
        output, interrupted = run_pytest(args, ctx.left_s())
        ctx.log("pytest " + " ".join(args) + "\n" + output)
        result = {"args": args, **summary(output)}
        if interrupted:
            result["stopped"] = "interrupted at the time budget: the counts are of what ran"
        ctx.record["runs"].append(result)
        ctx.save()
    ran = [r for r in ctx.record["runs"] if "passed" in r]
    for name in COUNTS:
        ctx.record[name] = sum(r[name] for r in ran)
    ctx.record["failures"] = [line for r in ran for line in r["failures"]]
    if ctx.record["failed"] or ctx.record["errors"]:
        ctx.record["error"] = f"{ctx.record['failed']} failed, {ctx.record['errors']} errors (see failures)"


SUITE = Suite(
    name="gpu-tests",
    summary="the tests on the GPU: pytest -m gpu, and tests/kernels, tests/api, tests/launch",
    measures="pass, fail, skip and error counts of every gpu-marked test and of tests/kernels, tests/api and "
             "tests/launch, run on the GPU (up to 8 pytest-xdist workers), and each failure's line",
    shapes="the tests' own. --quick: the gpu-marked tests of tests/launch/test_timing.py",
    budget_s=540, min_s=60, run=run, needs="gpu")
