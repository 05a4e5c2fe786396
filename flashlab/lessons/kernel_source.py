"""Reading kernels in the notebooks: a Triton kernel with the jit helpers it calls, and the
lines of them that implement one feature.

Notebooks 05 and 06 show the minimal kernels whole, then each production feature as the
lines it adds. Those lines are found in the package's own source at run time (by what
they contain, not by line numbers), so the notebooks show the code that runs, whatever
it has been refactored into; a feature whose lines cannot be found fails loudly.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from types import ModuleType


def _functions(module: ModuleType) -> dict[str, object]:
    """Every function of ``module`` by name, ``@triton.jit`` ones through ``.fn``."""
    return {name: getattr(obj, "fn", obj) for name, obj in vars(module).items()
            if inspect.isfunction(getattr(obj, "fn", obj))}


def _jit_sources(module: ModuleType) -> dict[str, str]:
    """Source of every function of ``module``, and of every function of the modules of its own
    package it imports from (the kernels' shared rules, `flashlab.kernels.tile`), so that a helper
    reached only through another helper (``visible``, called by ``masked_scores``) is found too."""
    package = module.__name__.rpartition(".")[0]
    own = {name: fn for name, fn in _functions(module).items()
           if fn.__module__ == module.__name__ or fn.__module__.rpartition(".")[0] == package}
    sources = {name: textwrap.dedent(inspect.getsource(fn)) for name, fn in own.items()}
    for home in sorted({fn.__module__ for fn in own.values()} - {module.__name__}):
        for name, fn in _functions(sys.modules[home]).items():
            if fn.__module__ == home and name not in sources:
                sources[name] = textwrap.dedent(inspect.getsource(fn))
    return sources


def kernel_parts(module: ModuleType, kernel: str) -> dict[str, str]:
    """``kernel`` of ``module`` and every function of the module it calls, directly or not,
    in the order they are first called: ``{name: source}``."""
    sources = _jit_sources(module)
    if kernel not in sources:
        raise ValueError(f"kernel: {module.__name__} has no function {kernel!r}. "
                         f"Pick one of {sorted(sources)}.")
    parts, todo = {}, [kernel]
    while todo:
        name = todo.pop(0)
        if name in parts:
            continue
        parts[name] = sources[name]
        calls = [node.func.id for node in ast.walk(ast.parse(sources[name]))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
        todo += [c for c in calls if c in sources and c not in parts]
    return parts


def part_containing(parts: dict[str, str], text: str) -> str:
    """The name of the one part whose source contains ``text`` (e.g. the loop over key blocks)."""
    names = [name for name, source in parts.items() if text in source]
    if len(names) != 1:
        raise ValueError(f"text: {text!r} occurs in {names or 'none'} of {list(parts)}. "
                         "Pass a piece of code that occurs in exactly one of them.")
    return names[0]


# a continuation line that only passes names along (``False, IS_CAUSAL, HAS_MASK,``): plumbing
_ARGUMENTS_ONLY = re.compile(r"[\w\s,.*+]*\)?,?")


def _body_start(source: str) -> int:
    """Index of the first line of a function's body after its signature and docstring."""
    body = ast.parse(source).body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1:
        body = body[1:]
    return body[0].lineno - 1


# a block opened by a matched line (``if HAS_MASK:``) is shown whole up to this many lines, else its
# header and first statement
_WHOLE_BLOCK_LINES = 8


def _statement_lines(statements: list[ast.stmt], line: int, lines: list[str],
                     with_block: bool = True) -> tuple[set[int], set[int]] | None:
    """For a match on ``line``: (the 1-based lines of the statement it is part of, the headers of the
    blocks that hold it). The statement is whole (a call written over several lines reads as one); on
    the header of a block it is the header and, ``with_block``, the block (whole when short, else its
    first statement). The headers (``if MASK_IS_BOOL:`` … ``else:``) keep the indentation readable.
    None when no statement holds the line."""
    for node in statements:
        if not node.lineno <= line <= node.end_lineno:
            continue
        body = getattr(node, "body", None)
        if not body:                                         # a simple statement: all of its lines
            return set(range(node.lineno, node.end_lineno + 1)), set()
        if line < body[0].lineno:                           # the block's header (``if …:``, ``for …:``)
            if not with_block:
                return set(range(node.lineno, body[0].lineno)), set()
            if node.end_lineno - node.lineno < _WHOLE_BLOCK_LINES:
                return set(range(node.lineno, node.end_lineno + 1)), set()
            return set(range(node.lineno, body[0].end_lineno + 1)), set()
        header = set(range(node.lineno, body[0].lineno))
        orelse = getattr(node, "orelse", [])
        for block in (body, orelse, getattr(node, "finalbody", []),
                      *(handler.body for handler in getattr(node, "handlers", []))):
            inner = _statement_lines(block, line, lines, with_block)
            if inner is None:
                continue
            if block is orelse and orelse and not lines[orelse[0].lineno - 1].lstrip().startswith("elif"):
                else_line = orelse[0].lineno - 1                 # ast keeps no line for ``else:``: the one above
                while else_line > node.lineno and not re.match(r"\s*else\s*:", lines[else_line - 1]):
                    else_line -= 1
                header.add(else_line)
            return inner[0], header | inner[1]
        return {line}, header                                # a comment line inside the block
    return None


def feature_lines(parts: dict[str, str], *needles: str, context: int = 0) -> str:
    """The lines of ``parts`` that contain any of ``needles``, each with the rest of its statement
    (a call over several lines is shown whole; a matched ``if …:`` with its block) under the headers
    of the blocks that hold it and the comment lines just above, plus ``context`` lines around each,
    grouped under the name of the function they are in, ``…`` marking a gap."""
    shown, missing = [], set(needles)
    for name, source in parts.items():
        lines = source.splitlines()
        body = _body_start(source)
        statements = ast.parse(source).body[0].body
        hits = set()
        for i, line in enumerate(lines[body:], start=body):
            code = line.split("#")[0]
            found = [n for n in needles if n in code]
            if found and not _ARGUMENTS_ONLY.fullmatch(code.strip()):
                missing -= set(found)
                matched, headers = _statement_lines(statements, i + 1, lines) or ({i + 1}, set())
                hits |= {n - 1 for n in matched | headers}
                for around in range(min(matched) - context, max(matched) + context + 1):   # context: whole statements
                    if (body < around <= len(lines) and around not in matched
                            and lines[around - 1].strip()[:1] not in ("", "#")):   # not a blank or comment line
                        context_lines = _statement_lines(statements, around, lines, with_block=False)
                        hits |= {n - 1 for n in (context_lines[0] if context_lines else {around})}
        for i in sorted(hits):                                  # the comment just above a shown line says why
            while i - 1 >= body and lines[i - 1].lstrip().startswith("#"):
                i -= 1
                hits.add(i)
        if hits:
            shown.append(f"# in {name}:")
            previous = None
            for i in sorted(hits):
                if previous is not None and i != previous + 1:
                    shown.append("    …")
                shown.append(lines[i])
                previous = i
    if missing:
        raise ValueError(f"needles: {sorted(missing)} found in no code line of {list(parts)}. "
                         "The kernels changed: update the notebook's needles.")
    return "\n".join(shown)


def specialised(source: str, **flags: bool) -> str:
    """``source`` (one function) as the compiler sees it for the given compile-time ``flags``: each
    ``if FLAG:`` on one of them (a bare name) replaced by the branch taken, dedented, and the other
    dropped, as a ``constexpr`` branch is. E.g. ``specialised(src, OVERLAP=False)``."""
    lines = source.splitlines()
    tree = ast.parse(textwrap.dedent(source))
    on_names = [n for n in ast.walk(tree) if isinstance(n, ast.If) and isinstance(n.test, ast.Name)]
    unknown = set(flags) - {n.test.id for n in on_names}
    if unknown:
        raise ValueError(f"flags: {sorted(unknown)} are tested by no `if FLAG:` of the source. "
                         "Pass flags it branches on.")
    branches = [n for n in on_names if n.test.id in flags]
    for node in sorted(branches, key=lambda n: n.lineno, reverse=True):     # bottom up: line numbers stay valid
        if any(o is not node and o.lineno < node.lineno <= o.end_lineno for o in branches):
            continue                                   # inside another branch on a flag: that one decides
        taken = node.body if flags[node.test.id] else node.orelse
        indent = len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())
        kept = []
        if taken:
            first = taken[0].lineno
            while first - 1 > node.lineno and lines[first - 2].strip().startswith("#"):
                first -= 1                             # a comment heading the branch stays with it
            kept = [line[4:] if line[:indent + 4].strip() == "" else line
                    for line in lines[first - 1:taken[-1].end_lineno]]
        lines[node.lineno - 1:node.end_lineno] = kept or [" " * indent + "pass"]
    return "\n".join(lines) + ("\n" if source.endswith("\n") else "")
