"""Fenced code blocks of the docs, with the marker that tells the tests what to do.

A doc author marks a block with an HTML comment on the line right before its fence
(invisible on the rendered page and on GitHub):

- ``<!-- docs-test: run -->`` before a ```` ```python ```` block: run by
  ``tests/test_docs_snippets.py`` (any page, README.md included), in the test settings
  with an empty database; the marked blocks of one page share one namespace, in order.
- In docs/quickstart.md, ``tests/test_quickstart.py`` runs every ```` ```bash ```` block
  in order, and also understands ``<!-- docs-test: append PATH -->`` /
  ``<!-- docs-test: write PATH -->`` (the block's text is appended to / written as that
  file), ``<!-- docs-test: background -->`` (a command that serves: started in the
  background, then waited for) and ``<!-- docs-test: skip -->`` (not run; say why in the
  prose).

The rules are written down for doc authors in docs/design-decisions.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: ``<!-- docs-test: ACTION [ARG] [(a comment for the reader)] -->``
MARKER = re.compile(
    r"^<!--\s*docs-test:\s*(?P<action>[a-z]+)(?:\s+(?P<arg>[^\s()]+))?(?:\s*\(.*\))?\s*-->$"
)
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<lang>[\w-]*)\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    action: str  # "" when the block carries no marker
    arg: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the marker on the line before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        marker = MARKER.match(lines[i - 1].strip()) if i > 0 else None
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][indent:])
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{i + 1}: unclosed code fence")
        out.append(
            Block(
                path=path,
                line=i + 1,
                lang=opening["lang"],
                action=marker["action"] if marker else "",
                arg=(marker["arg"] or "") if marker else "",
                text="\n".join(body) + "\n",
            )
        )
        i = j + 1
    return out


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
