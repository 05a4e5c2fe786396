"""The notebooks suite's comparison of an executed notebook with the committed one."""

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from flashlab.bench.suites.notebooks import compare


def _notebook(outputs):
    cells = [new_markdown_cell("# A lesson")]
    for source, text in outputs:
        cells.append(new_code_cell(source, outputs=[new_output("stream", name="stdout", text=text)]))
    return nbformat.from_dict(new_notebook(cells=cells))


def test_same_differing_and_meant_to_vary_cells_are_counted_apart():
    committed = _notebook([("print(1)", "1\n"), ("print(2)", "2\n"), ("# NBVAL_IGNORE_OUTPUT\nprint(t)", "0.1 s\n")])
    executed = _notebook([("print(1)", "1\n"), ("print(2)", "3\n"), ("# NBVAL_IGNORE_OUTPUT\nprint(t)", "0.2 s\n")])
    assert compare(committed, executed) == {"cells_same": 1, "cells_differ": ["cell 2: print(2)"],
                                            "cells_meant_to_vary": 1}


def test_an_error_in_the_executed_notebook_is_a_difference():
    committed = _notebook([("x = f()", "")])
    executed = _notebook([("x = f()", "")])
    executed.cells[1].outputs = [new_output("error", ename="NameError", evalue="name 'f' is not defined",
                                            traceback=[])]
    assert compare(committed, executed)["cells_differ"] == ["cell 1: x = f()"]
