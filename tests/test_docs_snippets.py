"""Code blocks of the docs that can run are run, so a doc example cannot rot.

A ```` ```python ```` block marked ``<!-- docs-test: run -->`` (see tests/docs_blocks.py
and docs/design-decisions.md) is executed here in the test settings with an empty
database; the marked blocks of one page share one namespace, in order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .docs_blocks import DOCS, MARKER, ROOT, blocks, pages

QUICKSTART_ACTIONS = {"append", "write", "background", "skip"}


def runnable(path: Path) -> list:
    return [b for b in blocks(path) if b.action == "run"]


PAGES_WITH_SNIPPETS = [p for p in pages() if runnable(p)]


def test_markers_are_known_and_on_the_right_blocks() -> None:
    problems = []
    for path in pages():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "docs-test" in line and line.lstrip().startswith("<!--"):
                if not MARKER.match(line.strip()):
                    problems.append(f"{path.name}:{number}: malformed marker {line.strip()!r}")
        for block in blocks(path):
            if not block.action:
                continue
            if block.action == "run":
                if block.lang != "python":
                    problems.append(f"{block.where}: 'run' marks a {block.lang!r} block")
            elif block.action in QUICKSTART_ACTIONS:
                if path != DOCS / "quickstart.md":
                    problems.append(f"{block.where}: {block.action!r} outside quickstart.md")
            else:
                problems.append(f"{block.where}: unknown marker {block.action!r}")
    assert problems == []


def test_there_are_snippets_to_run() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES_WITH_SNIPPETS}
    assert {"README.md", "docs/quickstart.md", "docs/api.md", "docs/architecture.md"} <= names


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", PAGES_WITH_SNIPPETS, ids=[p.relative_to(ROOT).as_posix() for p in PAGES_WITH_SNIPPETS]
)
def test_page_snippets_run(path: Path) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_snippet_{path.stem}"}
    for block in runnable(path):
        code = compile(block.text, block.where, "exec")
        exec(code, namespace)  # the docs' own examples
