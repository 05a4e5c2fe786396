"""Numbers in a notebook's prose come from its code.

A figure quoted in a markdown cell must appear in one of the same notebook's code cells
(its source, where a constant is set or a string is rendered) or outputs (where it was
printed or rendered with IPython.display.Markdown). Otherwise prose can drift from the
measurements beside it, as "3.1×" did next to a table printing 3.43× and 3.52×.

What counts as a quoted number (`quoted_numbers`):
- a number with a decimal point (3.1, 0.46), or with a % or × after it (85%, 6×), or with
  three or more digits (132, 1,000, 65,536), or with a k after it (16k = 16,000 or 16,384),
  or after ≈ or ~ (d/2 ≈ 32);
- not part of a word or a name (H200, fp16, sm_90, ex03b, 1e-5), not in a fenced code block,
  not in a link's address; LaTeX is prose (1.8\times10^{-4} quotes 1.8).

When it is found (`backed`): some number in the code or outputs has the same value once
rounded to the decimals the prose shows (prose 3.2 ← printed 3.197, 27k ← 26,908); thousands separators
do not matter (65,536 = 65536); a percentage may also be printed as a fraction
(98.8% ← 0.988).

`ALLOWED` is the short list of constants that need no code: powers of two (tile sizes,
sequence lengths, head dimensions) and the years of cited papers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]*_*.ipynb"))

ALLOWED = {float(2**e) for e in range(7, 21)} | {float(year) for year in range(2014, 2027)}

# a number not glued to a word: digits with optional thousands separators and decimals, then
# an optional k, %, ×; no letter, digit or decimal point may follow
_NUMBER = re.compile(
    r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?\s?([kK](?![\w])|%|×|x(?![\w]))?(?![\w.]\d|[a-zA-Z_\d])")
_FENCE = re.compile(r"```.*?```", re.S)
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
# an f-string's format spec ({x:>32}, {y:.2f}): its widths are not figures
_FORMAT_SPEC = re.compile(r":[<>^=]?[+-]?#?0?\d*,?(?:\.\d+)?[a-zA-Z%]?\}")
_CODE_NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:[eE]([+-]?\d+))?(?![\w])")


def quoted_numbers(markdown: str) -> list[tuple[str, float, int, str]]:
    """(text, value, decimals shown, suffix) of each number the prose quotes."""
    text = _LINK_TARGET.sub("]", _FENCE.sub(" ", markdown))
    found = []
    for match in _NUMBER.finditer(text):
        whole, fraction, suffix = match.group(1), match.group(2) or "", (match.group(3) or "").lower()
        digits = whole.replace(",", "")
        approximate = re.search(r"(≈|~|\\approx|\\sim)\s*\$?\s*$", text[:match.start()])
        if not (fraction or suffix or len(digits) >= 3 or approximate):
            continue
        found.append((match.group(0).strip(), float(digits + fraction), len(fraction) - 1 if fraction else 0,
                      suffix))
    return found


def code_numbers(text: str) -> set[float]:
    """Every number written in code or printed in an output (1e-5 and 4.3e12 included)."""
    values = set()
    for match in _CODE_NUMBER.finditer(text):
        whole, fraction, exponent = match.group(1), match.group(2) or "", match.group(3)
        value = float(whole.replace(",", "") + fraction)
        values.add(value * 10 ** int(exponent) if exponent else value)
    return values


def _cell_text(cell: dict) -> tuple[str, str]:
    source = "".join(cell["source"])
    if cell["cell_type"] != "code":
        return source, ""
    shown = [_FORMAT_SPEC.sub("}", source)]
    for output in cell.get("outputs", []):
        if "text" in output:
            shown.append("".join(output["text"]))
        for kind in ("text/plain", "text/markdown", "text/html", "text/latex"):
            if kind in output.get("data", {}):
                shown.append("".join(output["data"][kind]))
    return "", "\n".join(shown)


def backed(value: float, decimals: int, suffix: str, evidence: set[float]) -> bool:
    """True if the quoted number is a constant, or some number of the evidence rounds to it."""
    if value in ALLOWED or (suffix == "k" and {value * 1000, value * 1024} & ALLOWED):
        return True
    for shown in evidence:
        scaled = {"%": [shown, shown * 100], "k": [shown / 1000, shown / 1024]}.get(suffix, [shown])
        if any(abs(round(x, decimals) - value) < 10 ** -(decimals + 3) * max(1.0, value) for x in scaled):
            return True
    return False


def unbacked_numbers(path: Path) -> list[str]:
    """The numbers quoted in a notebook's markdown that none of its code cells or outputs shows."""
    cells = json.loads(path.read_text())["cells"]
    markdown = [_cell_text(c)[0] for c in cells if c["cell_type"] == "markdown"]
    evidence = set()
    for c in cells:
        evidence |= code_numbers(_cell_text(c)[1])
    missing = []
    for i, text in enumerate(markdown):
        for quoted, value, decimals, suffix in quoted_numbers(text):
            if not backed(value, decimals, suffix, evidence):
                missing.append(f"markdown cell {i}: {quoted!r}")
    return missing


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_number_in_prose_is_printed_by_code(path):
    missing = unbacked_numbers(path)
    assert not missing, (f"{path.name}: numbers in prose that no code cell or output of the notebook shows "
                         f"(print them from the data, render the prose from code, or correct them): {missing}")


@pytest.mark.parametrize("markdown,expected", [
    ("the backward takes 3.1× the forward", [3.1]),
    ("0.46–0.52 at $N = 16384$", [0.46, 0.52, 16384]),
    ("about 85% of dense queries", [85]),
    ("1,000 instances and 65,536 tokens", [1000, 65536]),
    ("N up to 16k", [16]),
    ("about $d/2 \\approx 32$ FLOP/byte, ≈ 7 of them, 2 or 3", [32, 7]),
    ("on an H200 in fp16, sm_90, exercise ex03b, eps 1e-5, 2 layers, 8 heads", []),
    ("$\\approx 1.8\\times10^{-4}\\,\\Delta$ radians", [1.8]),
    ("see [the paper](https://arxiv.org/abs/2205.14135)\n```bash\npytest --seed 1234\n```", []),
])
def test_quoted_numbers_are_recognised(markdown, expected):
    assert [value for _, value, _, _ in quoted_numbers(markdown)] == expected


def test_a_changed_number_is_caught():
    evidence = code_numbers("print(f'{ratio:.2f}')  # 3.43\nratio 3.52× and 1,152 GB/s, tol 1e-5, 0.988")
    assert backed(3.43, 2, "×", evidence) and backed(3.4, 1, "", evidence) and backed(1152, 0, "", evidence)
    assert backed(98.8, 1, "%", evidence) and backed(1e-5, 5, "", evidence)
    assert not backed(3.1, 1, "×", evidence)
    assert not backed(3.44, 2, "", evidence)
    assert backed(27, 0, "k", code_numbers("26,908")) and not backed(28, 0, "k", code_numbers("26,908"))
