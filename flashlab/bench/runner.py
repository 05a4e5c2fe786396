"""Runs suites by name within one time budget and packs what they wrote.

Each suite runs in a process of its own (a suite may set switches, wrap kernels or fill the GPU's
memory; the next one starts clean), its output going to its log. The suites share the budget in
the order given: each gets its own budget or what is left, whichever is less (said when it is
less), and one that would get less than its minimum is skipped (said too). A suite's process is
told to stop starting work a margin before its share ends and is stopped at the end of it; the
record it saved after its last finished piece stays. Layout under the output folder:

    <gpu>/<record>.json   the record: environment, command, the suite's data
    <gpu>/<record>.log    the suite's output
    <gpu>/<record>/       files a suite writes beside its record (training metrics), if any
    run.log               what the runner said
    records.tar.gz        all of the above (``tar -xzf records.tar.gz -C results`` files them)

``<gpu>`` is the device's short name (`flashlab.bench.suite.device_slug`: h100, h200, cpu).
A suite that measures the host (``on_cpu_record``) files its record under cpu/ on any machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import traceback
from pathlib import Path

import torch

from flashlab.bench.records import environment
from flashlab.bench.suite import Context, Suite, device_slug
from flashlab.launch.timing import Stopwatch

TARBALL = "records.tar.gz"
RUN_LOG = "run.log"


def stop_margin(share_s: float) -> float:
    """How long before the end of its share a suite is told to stop starting work: a tenth of the
    share, between 2 and 30 s (a benchmark shape or a compilation in progress finishes)."""
    return min(30.0, max(2.0, 0.1 * share_s))


def run_suites(suites: list[Suite], out: Path, budget_s: float, quick: bool, command: str,
               tar_only: bool = False) -> int:
    """Runs ``suites`` in order within ``budget_s`` seconds, writing under ``out``. Returns 0 if
    every suite that ran finished without an error, 1 otherwise (skipped suites do not count)."""
    out.mkdir(parents=True, exist_ok=True)
    has_gpu = torch.cuda.is_available()
    slug = device_slug(torch.cuda.get_device_name(0) if has_gpu else None)
    watch, said, written, failed = Stopwatch(), [], [], False

    def say(line: str) -> None:
        said.append(line)
        print(line, flush=True)

    for suite in suites:
        refusal = suite.refusal(has_gpu, quick)
        if refusal:
            say(refusal)
            continue
        left = budget_s - watch.seconds()
        if left < suite.min_s:
            say(f"{suite.name}: skipped, it needs at least {suite.min_s:.0f} s and {max(left, 0):.0f} s are left")
            continue
        share = min(suite.budget_s, left)
        if share < suite.budget_s and not quick:
            say(f"{suite.name}: shortened to {share:.0f} s of its {suite.budget_s:.0f} s; its record says what it "
                "left out")
        folder = out / ("cpu" if suite.on_cpu_record else slug)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{suite.record}.json"
        path.unlink(missing_ok=True)
        status = _run_in_child(suite, path, share, quick, command)
        record = json.loads(path.read_text()) if path.exists() else None
        if record is None or status != "done":
            record = _mark(record, status, path.with_suffix(".log"), command, quick, suite)
            path.write_text(json.dumps(record, indent=1, default=str) + "\n")
        failed = failed or "error" in record
        say(f"{suite.name}: {status if 'error' not in record else 'error: ' + str(record['error'])[:200]} "
            f"({record.get('seconds', '?')} s) → {path.relative_to(out)}")
        written += [p for p in (path, path.with_suffix(".log"), path.with_suffix("")) if p.exists()]
    (out / RUN_LOG).write_text("\n".join(said) + "\n")
    _pack(out, [*written, out / RUN_LOG], tar_only)
    print(f"packed into {out / TARBALL}" + (" (the loose files removed: --tar-only)" if tar_only else ""), flush=True)
    return 1 if failed else 0


def _run_in_child(suite: Suite, path: Path, share_s: float, quick: bool, command: str) -> str:
    """Runs one suite in a process of its own; "done", "failed (exit status N)" or "stopped at its
    time limit"."""
    soft = max(1.0, share_s - stop_margin(share_s))
    args = [sys.executable, "-m", "flashlab.bench.runner", suite.name, str(path), str(soft), "1" if quick else "0",
            command]
    with open(path.with_suffix(".log"), "w") as log:
        child = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            code = child.wait(timeout=share_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)      # the suite and whatever it started (pytest workers)
            child.wait()
            return "stopped at its time limit"
    return "done" if code == 0 else f"failed (exit status {code})"


def _mark(record: dict | None, status: str, log: Path, command: str, quick: bool, suite: Suite) -> dict:
    """A record for a suite that was stopped or failed: what it saved, with why it ended."""
    if record is None:
        record = {"suite": suite.name, "environment": environment(), "command": command, "quick": quick}
    tail = log.read_text().splitlines()[-5:] if log.exists() else []
    if status.startswith("stopped"):
        record["stopped"] = "at its time limit; what it saved before is above"
    elif status != "done" and "error" not in record:
        record["error"] = f"{status}: " + " | ".join(tail)[-500:]
    return record


def _pack(out: Path, paths: list[Path], tar_only: bool) -> None:
    with tarfile.open(out / TARBALL, "w:gz") as tar:
        for path in paths:
            tar.add(path, arcname=str(path.relative_to(out)))
    if tar_only:
        for path in paths:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        for folder in {path.parent for path in paths} - {out}:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


def child_main(argv: list[str]) -> int:
    """One suite in this process: ``SUITE RECORD_PATH BUDGET_S QUICK COMMAND`` (the runner's call)."""
    from flashlab.bench.suites import SUITES
    name, path, budget_s, quick, command = argv
    suite = SUITES[name]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    record = {"suite": name, "environment": environment(), "command": command, "quick": quick == "1",
              "budget_s": round(float(budget_s), 1)}
    ctx = Context(suite, device, quick == "1", float(budget_s), Path(path), record)
    ctx.save()
    try:
        suite.run(ctx)
    except Exception as exc:                          # recorded with what was measured before it
        traceback.print_exc()
        record["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
        ctx.save()
        return 1
    ctx.save()
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
