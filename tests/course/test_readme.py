"""The README is the learner's first screen: it starts with the path (set-up, notebook 00, the
exercise loop) before `make test`, which is for authors and CI; every page and file it or a page of
docs/ links to exists."""

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_first_screen_is_the_learners_path():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Start here")
    for step in ("make lab", "00_setup.ipynb", "make test-ex EX=", "make progress"):
        assert start < readme.index(step), f"README: {step!r} belongs under 'Start here'"
    assert readme.index("make progress") < readme.index("`make test`"), "make test (authors, CI) comes after the loop"
    assert readme.index("## Start here") < readme.index("## Syllabus") < readme.index("## What `make test` is for")


def test_every_link_of_the_readme_and_docs_resolves():
    missing = [f"{page.relative_to(ROOT)}: {target}" for page in PAGES for target in LINK.findall(page.read_text())
               if "://" not in target and not (page.parent / target).exists()]
    assert not missing, "links to nothing:\n" + "\n".join(missing)
    assert LINK.findall("see [results](docs/results.md#the-trainer) and [x](https://e.org)") == ["docs/results.md",
                                                                                                "https://e.org"]
