"""results/ holds records, not diaries: results/<gpu>/<record>.json (+ .log) is the current record of a
suite, with its environment and the command that made it; no path carries a date or a run number;
every record a notebook, the README or a page of docs/ names exists, and results/README.md says what each one is."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from flashlab.bench.suites import SUITES

ROOT = Path(__file__).parents[2]
RESULTS = ROOT / "results"
HISTORY = re.compile(r"\d{4}-\d{2}-\d{2}|issue\d|_run\d|run_\d|before|after|_first|_second|_third|_old|_new")
NAMED = re.compile(r"results/[A-Za-z0-9_./\-]*[A-Za-z0-9_/]")
READ = re.compile(r"\b(load|folder)\(\s*\\?[\"']([A-Za-z0-9_\-/]+)\\?[\"'](?:\s*,\s*gpu\s*=\s*\\?[\"'](\w+)\\?[\"'])?")


def result_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file())


def test_no_path_under_results_carries_a_date_or_a_run_number():
    paths = [str(p.relative_to(RESULTS)) for p in result_files()]
    assert len(paths) > 20
    dated = [p for p in paths if HISTORY.search(p)]
    assert not dated, f"history as file names (git keeps history): {dated[:10]}"
    assert HISTORY.search("h200/small_graphs_table_2026-12-05.json")
    assert HISTORY.search("cpu/python_layers_before_run1.json") and not HISTORY.search("h200/small-table.json")


def test_every_record_carries_its_suite_environment_and_command():
    records = [p for p in result_files() if p.suffix == ".json"]
    assert records
    for path in records:
        record = json.loads(path.read_text())
        where = path.relative_to(RESULTS)
        assert record.get("suite") in SUITES, f"{where}: suite {record.get('suite')!r} is not a suite's name"
        assert record.get("command"), f"{where}: no command"
        assert {"gpu", "torch", "date"} <= set(record.get("environment") or {}), f"{where}: environment incomplete"
        if path.parent.parent == RESULTS:                      # results/<gpu>/<record>.json
            assert path.stem in {s.record for s in SUITES.values()} or "no suite rewrites" in record.get("what", ""), \
                f"{where}: neither a suite's record nor a fixed record that says so"


def names_in(text: str) -> set[str]:
    """results/ paths and records read by name (load("…", gpu="…"), folder("…")) in a text."""
    names = {m.group(0).rstrip("/.") for m in NAMED.finditer(text) if "<" not in m.group(0)}
    for kind, name, gpu in READ.findall(text):
        names.add(f"results/{gpu or 'h200'}/{name}" + (".json" if kind == "load" else ""))
    return names


def test_every_record_a_notebook_or_the_readme_names_exists():
    sources = {"README.md": (ROOT / "README.md").read_text()}
    sources.update({f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))})
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        sources[path.name] = "\n".join("".join(cell["source"]) for cell in cells)
    named = {(where, name) for where, text in sources.items() for name in names_in(text)}
    assert len(named) > 30
    missing = sorted(f"{where}: {name}" for where, name in named if not (ROOT / name).exists())
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)
    assert names_in('load("small-table")  folder("tsp-training")  load("x", gpu="cpu")  results/h200/a.json') == {
        "results/h200/small-table.json", "results/h200/tsp-training", "results/cpu/x.json", "results/h200/a.json"}


def test_the_index_says_what_every_record_is():
    index = (RESULTS / "README.md").read_text()
    for path in result_files():
        if path.suffix == ".json" and path.parent.parent == RESULTS:
            assert f"{path.parent.name}/{path.name}" in index, f"results/README.md does not index {path}"
    assert not re.search(r"\d{4}-\d{2}-\d{2}", index), "the index names records, not when they were made"


def test_the_tree_fits_what_a_gpu_call_carries():
    """A device call carries the tracked files and the untracked ones git does not ignore, 64 MiB at
    most; kept under 56 MiB, room for carried wheels (.whl/) and a session's new records."""
    import shutil
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    sizes = {name: (ROOT / name).stat().st_size for name in listed if name and (ROOT / name).is_file()}
    total = sum(sizes.values())
    largest = ", ".join(f"{name} {size / 2**20:.1f} MiB"
                        for name, size in sorted(sizes.items(), key=lambda item: -item[1])[:3])
    assert total < 56 * 2**20, f"the tree is {total / 2**20:.1f} MiB (largest: {largest}); a GPU call carries 64 MiB"
