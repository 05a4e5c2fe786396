"""notebooks: every course notebook executed top to bottom where the suite runs, as a learner's
JupyterLab would (nbclient, one fresh kernel per notebook, the notebook's folder as the working
directory). On a GPU the notebooks take their GPU branches at the sizes their prose names; the
record holds each notebook's wall time, cell count, the first error if any, and how many code
cells printed what the committed notebook shows (cells marked ``# NBVAL_IGNORE_OUTPUT`` are
counted apart: their output is meant to vary). The executed notebooks go beside the record.

The time budget is shared in order: a notebook that would start with less than its share of a
minute left is recorded as skipped."""

from __future__ import annotations

import copy
from pathlib import Path

from flashlab.bench.suite import Context, Suite
from flashlab.launch.timing import Stopwatch

NOTEBOOKS = Path(__file__).resolve().parents[3] / "notebooks"
CELL_TIMEOUT_S = 600
MIN_LEFT_S = 60


def _text(outputs) -> str:
    """What a cell printed, as nbval compares it: streams and text/plain results, in order."""
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") in ("execute_result", "display_data"):
            parts.append(out.get("data", {}).get("text/plain", ""))
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}")
    return "".join("".join(p) if isinstance(p, list) else p for p in parts)


def compare(committed, executed) -> dict:
    """Code cells whose printed text matches the committed notebook's, those that differ (their
    first line each) and those marked to vary."""
    same, differ, ignored = 0, [], 0
    for index, (old, new) in enumerate(zip(committed.cells, executed.cells)):
        if old.cell_type != "code":
            continue
        if "NBVAL_IGNORE_OUTPUT" in old.source or "NBVAL_SKIP" in old.source:
            ignored += 1
        elif _text(old.get("outputs", [])) == _text(new.get("outputs", [])):
            same += 1
        else:
            differ.append(f"cell {index}: {old.source.splitlines()[0][:80] if old.source else ''}")
    return {"cells_same": same, "cells_differ": differ, "cells_meant_to_vary": ignored}


def run(ctx: Context) -> None:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    paths = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    if ctx.quick:
        paths = paths[:1]
    ctx.record["notebooks"] = []
    for path in paths:
        row = {"notebook": path.name}
        ctx.record["notebooks"].append(row)
        if ctx.left_s() < MIN_LEFT_S:
            row["status"] = ctx.skipped()
            ctx.save()
            continue
        committed = nbformat.read(path, as_version=4)
        notebook = copy.deepcopy(committed)
        client = NotebookClient(notebook, timeout=min(CELL_TIMEOUT_S, max(30, int(ctx.left_s()))),
                                kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
        watch = Stopwatch()
        try:
            client.execute()
            row["status"] = "ran"
        except CellExecutionError as exc:
            row["status"] = "error"
            row["error"] = str(exc).strip().splitlines()[-1][:300]
        except Exception as exc:                  # a kernel that died or a cell past its time limit
            row["status"] = "error"
            row["error"] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        row["seconds"] = round(watch.seconds(), 1)
        row["code_cells"] = sum(cell.cell_type == "code" for cell in notebook.cells)
        row.update(compare(committed, notebook))
        nbformat.write(notebook, ctx.files / path.name)
        ctx.log(f"{path.name}: {row['status']} in {row['seconds']} s, {row['cells_same']} cells as committed, "
                f"{len(row['cells_differ'])} differ, {row['cells_meant_to_vary']} meant to vary"
                + (f"; {row['error']}" if "error" in row else ""))
        ctx.save()
    errors = [r["notebook"] for r in ctx.record["notebooks"] if r.get("status") == "error"]
    if errors:
        ctx.record["error"] = "failed: " + ", ".join(errors)


SUITE = Suite(
    name="notebooks",
    summary="every notebook executed top to bottom (nbclient), its time and outputs against the committed ones",
    measures="per notebook: wall time, errors, code cells printing what the committed notebook prints",
    shapes="the notebooks' own (their GPU branches on a GPU). --quick: notebook 00 only",
    budget_s=540, min_s=60, run=run, needs="any", requires=("nbclient", "ipykernel"))
