"""The exercise loop as a learner meets it: what `pytest tests/exercises/test_exNN_….py` says about a file
Python cannot read (conftest.py's `exercise` fixture)."""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _learner_checkout(tmp_path, *paths):
    """The course's files a test run needs, copied into tmp_path (the exercises each test writes itself)."""
    for path in ("conftest.py", "tests/__init__.py", "tests/exercises/__init__.py", "tests/exercises/hints.py",
                 "exercises/__init__.py", *paths):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)


def _pytest(tmp_path, *args, cache=False):
    """pytest in the copy, flashlab imported from this checkout (PYTHONPATH), the exercises from the copy.
    With ``cache``, the project's own pytest options (pyproject.toml, copied) and pytest's cache
    (.pytest_cache/ in the copy), as `make test-ex` and `make progress` run; else neither."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if cache:
        for path in ("pyproject.toml", "notebooks/nbval_sanitize.cfg"):
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / path, tmp_path / path)
        options = []
    else:
        options = ["-p", "no:cacheprovider", "-o", "addopts="]
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *options, *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_an_exercise_with_a_syntax_error_is_one_line_per_test(tmp_path):
    """A learner's trial: a syntax error in ex03 printed importlib's traceback around the same caret
    once per test (seven times); now one line each, naming the file, the line and how to see it."""
    _learner_checkout(tmp_path, "tests/exercises/test_ex03_online_softmax.py")
    source = (ROOT / "solutions/ex03_online_softmax.py").read_text().splitlines()
    broken = next(i for i, line in enumerate(source) if line.startswith("def "))
    source[broken] = source[broken].rstrip(":")              # `def f(...)` without its colon
    (tmp_path / "exercises/ex03_online_softmax.py").write_text("\n".join(source) + "\n")
    done = _pytest(tmp_path, "tests/exercises/test_ex03_online_softmax.py")
    failures = [line for line in done.stdout.splitlines() if "SyntaxError" in line]
    assert done.returncode == 1 and failures, done.stdout[-3000:] + done.stderr[-2000:]
    assert "importlib" not in done.stdout, done.stdout[-3000:]
    want = f"exercises/ex03_online_softmax.py, line {broken + 1}: SyntaxError: expected ':'"
    assert all(want in line for line in failures), failures[:3]


def _progress_table(stdout: str) -> list[str]:
    """The table's lines: a row per exercise, then the total (a whole run) or the line for the others."""
    assert "exercise progress" in stdout, f"no progress table:\n{stdout[-3000:]}"
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "exercise progress" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(("exercises", "other exercises")))
    return lines[start + 1:end + 1]


def test_the_progress_table_is_the_same_on_one_process_and_on_xdist_workers(tmp_path):
    """The table at the end of a run says passed / failed / in progress / not started per exercise. make test
    runs on pytest-xdist workers, where the tests run in other processes than the one printing the table: the
    table must come out the same there (it once said "not run" for every exercise), for a whole run and for a
    run of one exercise."""
    import pytest
    pytest.importorskip("xdist")
    _learner_checkout(tmp_path, "tests/exercises/test_ex01_naive_attention.py",
                      "tests/exercises/test_ex02_fused_softmax.py", "tests/exercises/test_ex03_online_softmax.py",
                      "tests/exercises/padded_launch.py", "exercises/ex02_fused_softmax.py")
    exercises = tmp_path / "exercises"
    # ex01 wrong on purpose (a mask that hides nothing), ex02 the untouched stub, ex03 half done
    (exercises / "ex01_naive_attention.py").write_text((ROOT / "solutions/ex01_naive_attention.py").read_text() + (
        "\n\ndef causal_mask(n_queries, n_keys):\n    return torch.ones(n_queries, n_keys, dtype=torch.bool)\n"))
    (exercises / "ex03_online_softmax.py").write_text((ROOT / "solutions/ex03_online_softmax.py").read_text() + (
        "\n\ndef merge(*args, **kwargs):\n    raise NotImplementedError\n"))
    tables, tables_of_one = {}, {}
    for workers in ([], ["-n", "2"]):
        done = _pytest(tmp_path, "--tb=no", *workers, "tests")
        assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
        tables[len(workers)] = _progress_table(done.stdout)
        one = _pytest(tmp_path, "--tb=no", *workers, "tests/exercises/test_ex01_naive_attention.py")
        assert one.returncode == 1, one.stdout[-3000:] + one.stderr[-2000:]
        tables_of_one[len(workers)] = _progress_table(one.stdout)
    serial = tables[0]
    assert [line.split() for line in serial] == [
        ["ex01_naive_attention", "failed"], ["ex02_fused_softmax", "not", "started"],
        ["ex03_online_softmax", "in", "progress"],
        ["exercises:", "0", "passed,", "1", "failed,", "1", "not", "started,", "1", "in", "progress"]], serial
    assert tables[2] == serial, (serial, tables[2])
    assert [" ".join(line.split()) for line in tables_of_one[0]] == [      # no cache here: nothing recorded
        "ex01_naive_attention failed",
        "other exercises: 2 not run (no whole run recorded) — `make progress` for the whole table"], tables_of_one[0]
    assert tables_of_one[2] == tables_of_one[0], (tables_of_one[0], tables_of_one[2])


def test_a_table_of_one_exercise_says_where_the_others_stood(tmp_path):
    """A learner's trial: after a whole run, `make test-ex EX=02` printed every other exercise as "not run",
    as if the work on them were gone. Each exercise's state after its last whole run is kept in pytest's
    cache; a partial run does not overwrite it. A second trial: a row per exercise, all but one "not run", was
    noise; a run of some exercises prints their rows, then one line counting the others by that state (a whole
    run prints the whole table). The runs take the project's pytest options: a learner found the note missing
    because they disabled the cache."""
    _learner_checkout(tmp_path, "tests/exercises/test_ex01_naive_attention.py",
                      "tests/exercises/test_ex02_fused_softmax.py",
                      "tests/exercises/padded_launch.py", "exercises/ex02_fused_softmax.py")
    shutil.copy(ROOT / "solutions/ex01_naive_attention.py", tmp_path / "exercises/ex01_naive_attention.py")
    quick = ("--tb=no", "-p", "no:xdist")
    whole = _pytest(tmp_path, *quick, "tests", cache=True)                 # ex01 passes, ex02 is the stub
    assert [" ".join(line.split()) for line in _progress_table(whole.stdout)] == [
        "ex01_naive_attention passed", "ex02_fused_softmax not started",
        "exercises: 1 passed, 0 failed, 1 not started"], whole.stdout[-3000:]
    (tmp_path / "exercises/ex01_naive_attention.py").write_text("")       # every ex01 test fails now
    part = _pytest(tmp_path, *quick, "tests/exercises/test_ex01_naive_attention.py", "-k", "causal", cache=True)
    table = [" ".join(line.split()) for line in _progress_table(part.stdout)]
    assert len(table) == 2 and table[0].startswith("ex01_naive_attention failed (partial run: only"), table
    assert table[1] == ("other exercises (last whole run): 1 not started — `make progress` for the whole table"), table
    one = _pytest(tmp_path, *quick, "tests/exercises/test_ex02_fused_softmax.py", cache=True)
    table = [" ".join(line.split()) for line in _progress_table(one.stdout)]
    assert table == ["ex02_fused_softmax not started",                  # ex01: the whole run's, not the partial's
                     "other exercises (last whole run): 1 passed — `make progress` for the whole table"], table


def test_a_kernel_still_pass_under_a_written_launcher_is_not_started(tmp_path):
    """A Triton kernel cannot raise NotImplementedError as the other stubs do: a learner who wrote
    vector_add's launcher but not add_kernel's body saw 13 failures ("200 of 200 elements differ").
    The fixture now launches such a kernel as a NotImplementedError naming it: those tests say "not
    started", the launcher's own test passes, and the table says "in progress". Once the body is
    written, a wrong one fails as before."""
    _learner_checkout(tmp_path, "tests/exercises/test_ex00_vector_add.py", "tests/exercises/padded_launch.py")
    launcher_only = _kernel_without_body((ROOT / "solutions/ex00_vector_add.py").read_text(), "add_kernel")
    exercise = tmp_path / "exercises/ex00_vector_add.py"
    exercise.write_text(launcher_only)
    quick = ("-rs", "--tb=no", "-p", "no:nbval", "-p", "no:xdist")
    done = _pytest(tmp_path, *quick, "tests/exercises/test_ex00_vector_add.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "add_kernel's body is still the stub's `pass`: write it in exercises/ex00_vector_add.py" in done.stdout
    assert " ".join(_progress_table(done.stdout)[0].split()) == "ex00_vector_add in progress", done.stdout[-3000:]
    exercise.write_text(launcher_only.replace("    pass\n", "    tl.store(out_ptr, 0.0)\n"))
    wrong = _pytest(tmp_path, *quick, "tests/exercises/test_ex00_vector_add.py")
    assert wrong.returncode == 1 and "not started:" not in wrong.stdout, wrong.stdout[-3000:]


def _kernel_without_body(source: str, kernel: str) -> str:
    """``source`` with the body of its function ``kernel`` replaced by the stub's docstring and ``pass``."""
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == kernel)
    lines = source.splitlines()
    indent = " " * node.body[0].col_offset
    lines[node.body[0].lineno - 1:node.body[-1].end_lineno] = [f'{indent}"""(not written yet)"""', f"{indent}pass"]
    return "\n".join(lines) + "\n"


def test_a_store_outside_a_tensor_is_named_and_one_kernel_of_two_is_checked_alone(tmp_path):
    """Two learner's trials of ex05 and ex06. (1) ex05's L stored with O's base, head·N·D + offs_m: the store
    landed past L's end, and Triton's interpreter, writing where it is told, aborted pytest (no table, exit 134);
    now each launch runs on padded copies and the store is named. (2) ex06 with dkdv_kernel written and dq_kernel
    still `pass`: every test stopped at dq_kernel, so the finished kernel got no feedback; now dK and dV are
    checked alone, a wrong dV fails with a hint that does not blame P, and the table says in progress."""
    _learner_checkout(tmp_path, "tests/exercises/test_ex05_flash_forward.py",
                      "tests/exercises/test_ex06_flash_backward.py",
                      "tests/exercises/padded_launch.py")
    forward = (ROOT / "solutions/ex05_flash_forward.py").read_text()
    wrong_base = forward.replace("tl.store(L + head * seq_len + offs_m,", "tl.store(L + base + offs_m,")
    assert wrong_base != forward
    (tmp_path / "exercises/ex05_flash_forward.py").write_text(wrong_base)
    backward = _kernel_without_body((ROOT / "solutions/ex06_flash_backward.py").read_text(), "dq_kernel")
    (tmp_path / "exercises/ex06_flash_backward.py").write_text(backward)
    quick = ("-rs", "--tb=line", "-p", "no:nbval", "-p", "no:xdist")
    done = _pytest(tmp_path, *quick, "tests/exercises/test_ex05_flash_forward.py",
                   "tests/exercises/test_ex06_flash_backward.py",
                   "-k", "float32 or scale")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]       # failures, not an abort
    assert "flash_forward_kernel stored" in done.stdout and "outside L (an output" in done.stdout, done.stdout[-3000:]
    assert "not started: dK and dV match float64 here; dq_kernel's body is still the stub's `pass`" in done.stdout
    table = [" ".join(line.split()) for line in _progress_table(done.stdout)]
    assert "ex05_flash_forward failed (partial run: only" in " ".join(table), table
    assert "ex06_flash_backward in progress (partial run: only" in " ".join(table), table
    dv_halved = backward.replace("dv.to(DV.dtype.element_ty)", "(dv * 0.5).to(DV.dtype.element_ty)")
    assert dv_halved != backward
    (tmp_path / "exercises/ex06_flash_backward.py").write_text(dv_halved)
    wrong = _pytest(tmp_path, *quick, "tests/exercises/test_ex06_flash_backward.py", "-k", "100-100-32-False-float32")
    assert wrong.returncode == 1 and "the mistake is in dV = Pᵀ dO alone" in wrong.stdout, wrong.stdout[-3000:]
