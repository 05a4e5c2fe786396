"""nbval only compares cells that have outputs; a committed notebook that was never run
would pass silently. Every code cell must have been executed, in order, in one kernel."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# companions (07b_…, 09b_…): optional depth beside a lesson, executed and checked like it, outside the numbering
LESSONS = NOTEBOOKS + sorted((Path(__file__).parents[2] / "notebooks").glob("[0-9][0-9][a-z]_*.ipynb"))


def test_syllabus_order():
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers == list(range(len(numbers))), f"notebooks must be numbered 00, 01, …: {numbers}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_every_code_cell_executed_in_order(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    counts = [c.get("execution_count") for c in cells if "".join(c["source"]).strip()]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: execution counts {counts}; run `make notebooks` (fresh kernel, top to bottom)")


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_no_errors_and_first_cell_imports_flashlab(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    for c in cells:
        assert all(o["output_type"] != "error" for o in c.get("outputs", [])), \
            f"{path.name}: a cell was committed with an error"
    assert "flashlab" in "".join(cells[0]["source"]), f"{path.name}: first code cell must import flashlab"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_printed_output_is_one_block_per_stream(path):
    """A learner's trial saw blank lines inside a cell's printout on GitHub and in some viewers:
    a kernel that flushes stdout twice leaves two consecutive stream outputs, shown as two blocks.
    `make notebooks` merges them (nbconvert --coalesce-streams) after executing."""
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        outputs = cell.get("outputs", [])
        for before, after in zip(outputs, outputs[1:]):
            assert not (before["output_type"] == after["output_type"] == "stream"
                        and before["name"] == after["name"]), (
                f"{path.name}, cell {index}: two consecutive {before['name']} outputs; run `make notebooks` "
                "(or jupyter nbconvert --coalesce-streams on the notebook)")


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_cells_that_write_prose_have_their_code_folded(path):
    """A paragraph quoting measured numbers is written by a code cell from the numbers (Markdown(f"…")), so
    no number in the prose can drift from the data. A learner's trial had to scroll past 20-60 lines of
    formatting code to read each such paragraph: their code is folded in JupyterLab (metadata
    jupyter.source_hidden; click the cell's … to open it), and the paragraph shows as the output."""
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        writes_prose = cell["cell_type"] == "code" and any(
            "text/markdown" in output.get("data", {}) for output in cell.get("outputs", []))
        if writes_prose:
            assert cell["metadata"].get("jupyter", {}).get("source_hidden") is True, (
                f"{path.name}, cell {index}: a cell whose output is a paragraph (Markdown) should have its code "
                "folded: set the cell's metadata jupyter.source_hidden to true (JupyterLab: View → Collapse "
                "Selected Code)")
