"""Per-notebook size of the course: cells, words of markdown, figures, exercises.

    python -m measurements.notebook_stats                 # the notebooks as they are now
    python -m measurements.notebook_stats 17d7e78         # before (that git revision) → now

Words count the markdown cells and the prose code renders with IPython.display.Markdown;
figures are image outputs; exercises are the distinct exercise test files
(`tests/exercises/test_exNN_….py`) a notebook's markdown tells the learner to run.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stats(notebook: dict) -> dict:
    cells = notebook["cells"]
    markdown = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    # prose rendered by code (IPython.display.Markdown) is prose too
    rendered = ["".join(o["data"]["text/markdown"]) for c in cells if c["cell_type"] == "code"
                for o in c.get("outputs", []) if "text/markdown" in o.get("data", {})]
    figures = sum(1 for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])
                  if {"image/png", "image/svg+xml"} & set(o.get("data", {})))
    exercises = {m for text in markdown for m in re.findall(r"test_ex\w+\.py", text)}
    return {"cells": len(cells), "words": sum(len(text.split()) for text in markdown + rendered), "figures": figures,
            "exercises": len(exercises)}


def at_revision(revision: str, path: Path) -> dict | None:
    shown = subprocess.run(["git", "show", f"{revision}:{path.relative_to(ROOT)}"], cwd=ROOT, capture_output=True,
                           text=True)
    return json.loads(shown.stdout) if shown.returncode == 0 else None


def main(revision: str | None = None) -> None:
    fields = ("cells", "words", "figures", "exercises")
    print("| notebook | " + " | ".join(f"{f} before → after" if revision else f for f in fields) + " |")
    print("|---|" + "---|" * len(fields))
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        now = stats(json.loads(path.read_text()))
        before = at_revision(revision, path) if revision else None
        before = stats(before) if before else None
        cells = [f"{before[f]} → {now[f]}" if before else str(now[f]) for f in fields]
        print(f"| {path.stem} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:2])
