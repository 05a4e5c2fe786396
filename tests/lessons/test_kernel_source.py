"""flashlab.lessons.kernel_source: what notebooks 05 and 06 use to show the kernels' features."""

import pytest

from flashlab.kernels import dense as flash_triton
from flashlab.lessons import flash_minimal
from flashlab.lessons.kernel_source import feature_lines, kernel_parts, part_containing, specialised


def test_kernel_parts_follow_the_calls_of_a_kernel():
    parts = kernel_parts(flash_triton, "flash_forward_kernel")
    assert next(iter(parts)) == "flash_forward_kernel"
    assert len(parts) > 1                                           # the helpers it calls, found by name
    loop = part_containing(parts, "for start_n in range")
    assert "online_softmax_step(" in parts[loop]
    assert "exp2" in parts["online_softmax_step"], "the shared tile rules are followed into their module"
    assert "visible" in parts, "a shared rule reached only through another one (masked_scores) is found too"
    assert list(kernel_parts(flash_minimal, "minimal_forward_kernel")) == ["minimal_forward_kernel"]


def test_feature_lines_show_code_lines_under_their_function():
    text = feature_lines(kernel_parts(flash_minimal, "minimal_dkdv_kernel"), "delta")
    assert text.startswith("# in minimal_dkdv_kernel:")
    assert "ds = p * (dp - delta[:, None])" in text
    assert "def " not in text and "DELTA, DK" not in text       # not the signature


def test_missing_kernel_needle_or_ambiguous_part_fail_clearly():
    with pytest.raises(ValueError, match="kernel: .* no function 'nope'"):
        kernel_parts(flash_minimal, "nope")
    parts = kernel_parts(flash_minimal, "minimal_forward_kernel")
    with pytest.raises(ValueError, match=r"needles: \['no such code'\]"):
        feature_lines(parts, "tl.dot", "no such code")
    with pytest.raises(ValueError, match="text: "):
        part_containing(parts, "no such code")


def test_feature_lines_show_whole_statements_under_their_blocks():
    """A learner's trial read `dk, dv = _dkdv_tiles(…` cut mid-call and a dangling `FAST_PATH, BLOCK_M,
    BLOCK_N)`: a matched line brings its whole statement, the headers of the blocks around it (with
    `else:`) and the comment just above it; a context line is a whole statement, never a piece of one."""
    source = '''def kernel(X, FLAG):
    """Docstring line that mentions total."""
    total = combine(X, 1,
                    2, 3)
    if FLAG:
        a = 1
    else:
        # why b
        b = 2
        c = 3
    for i in range(10):
        d = i
        e = i
        f = i
        g = i
        h = i
        k = i
        m = i
        n = i
    last = 0
'''
    parts = {"kernel": source}
    lines = source.splitlines()
    shown = lambda *needles, **kw: feature_lines(parts, *needles, **kw).splitlines()[1:]   # noqa: E731
    assert shown("combine") == lines[2:4]                      # the call whole, not the docstring
    assert shown("b = 2") == [lines[4], "    …", *lines[6:9]]  # if … else: and the comment above
    assert shown("for i") == lines[10:12]                      # a long block: its header and first statement
    assert shown("f = i", context=1) == [lines[10], "    …", *lines[12:15]]
    assert shown("if FLAG") == lines[4:10]                     # a short block whole
    assert shown("last", context=1) == lines[18:20]


def test_specialised_keeps_the_branch_a_flag_takes():
    source = ("def f(x, A: tl.constexpr, B: tl.constexpr):\n"
              "    y = x\n"
              "    if A:\n"
              "        # A's way\n"
              "        y = y + 1\n"
              "        if B:\n"
              "            y = y * 2\n"
              "    else:\n"
              "        y = y - 1\n"
              "    if B:\n"
              "        y = -y\n"
              "    return y\n")
    assert specialised(source, A=True) == source.replace("    if A:\n", "").replace(
        "    else:\n        y = y - 1\n", "").replace("        # A's", "    # A's").replace(
        "        y = y + 1\n        if B:\n            y = y * 2\n", "    y = y + 1\n    if B:\n        y = y * 2\n")
    assert specialised(source, A=False, B=False) == ("def f(x, A: tl.constexpr, B: tl.constexpr):\n    y = x\n"
                                                     "    y = y - 1\n    pass\n    return y\n")
    with pytest.raises(ValueError, match=r"flags: \['C'\]"):
        specialised(source, C=True)
