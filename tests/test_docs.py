"""The reference docs keep up with the code: every setting and check id is documented."""

from __future__ import annotations

from pathlib import Path

from llm_routing.checks import MESSAGES
from llm_routing.conf import DEFAULTS

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_every_llm_routing_key_is_in_the_configuration_reference() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    missing = [key for key in DEFAULTS if f"| `{key}` |" not in text]
    assert missing == []


def test_every_check_id_is_in_the_configuration_reference() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    missing = [code for code in MESSAGES if f"`llm_routing.{code}`" not in text]
    assert missing == []
