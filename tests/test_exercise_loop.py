"""The exercise loop as a learner meets it: what `pytest tests/test_exNN_….py` says about a file
Python cannot read (conftest.py's `exercise` fixture)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_an_exercise_with_a_syntax_error_is_one_line_per_test(tmp_path):
    """A learner's trial: a syntax error in ex03 printed importlib's traceback around the same caret
    once per test (seven times); now one line each, naming the file, the line and how to see it."""
    for path in ("conftest.py", "tests/__init__.py", "tests/hints.py", "tests/test_ex03_online_softmax.py",
                 "exercises/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    source = (ROOT / "solutions/ex03_online_softmax.py").read_text().splitlines()
    broken = next(i for i, line in enumerate(source) if line.startswith("def "))
    source[broken] = source[broken].rstrip(":")              # `def f(...)` without its colon
    (tmp_path / "exercises/ex03_online_softmax.py").write_text("\n".join(source) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}             # flashlab from this checkout, the exercise from the copy
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           "tests/test_ex03_online_softmax.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    failures = [line for line in done.stdout.splitlines() if "SyntaxError" in line]
    assert done.returncode == 1 and failures, done.stdout[-3000:] + done.stderr[-2000:]
    assert "importlib" not in done.stdout, done.stdout[-3000:]
    want = f"exercises/ex03_online_softmax.py, line {broken + 1}: SyntaxError: expected ':'"
    assert all(want in line for line in failures), failures[:3]
