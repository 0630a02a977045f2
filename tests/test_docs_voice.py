"""The docs speak in one voice, to someone running their own project: present tense, no
issue numbers and no "this machine" outside the benchmark pages (and CHANGELOG.md), and
none of the stale claims a newcomer tripped over. Each test failed on main."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from llm_routing.checks import MESSAGES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
HISTORY = re.compile(r"\b[Ii]ssues? #?\d+|\bthis machine\b")


def voiced_pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    return [p for p in pages if not p.name.startswith("benchmarks")]


@pytest.mark.parametrize("doc", voiced_pages(), ids=lambda p: p.name)
def test_no_issue_numbers_or_this_machine(doc: Path) -> None:
    lines = doc.read_text(encoding="utf-8").splitlines()
    found = [f"{doc.name}:{n}: {line.strip()}" for n, line in enumerate(lines, 1)
             if HISTORY.search(line)]  # fmt: skip
    assert found == []


def section_of(text: str, needle: str) -> str:
    """The heading of the section that holds ``needle``."""
    before = text[: text.index(needle)]
    return [line for line in before.splitlines() if line.startswith("#")][-1]


def test_configuration_reference_files_keys_and_checks_where_they_belong() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert "Decision spool" not in section_of(text, "| `METRICS_TOKEN` |")
    checks = text[text.index("## System checks") :]
    assert [c for c in MESSAGES if f"| `llm_routing.{c}` |" not in checks] == []


def test_production_installs_what_exists_and_maps_the_demo_to_your_project() -> None:
    text = (DOCS / "production.md").read_text(encoding="utf-8")
    assert 'pip install "django-llm-routing[demo]"' not in text
    assert "In your own project" in text
    assert "New `LLM_ROUTING` keys" not in text


def test_architecture_states_the_status_codes_capabilities_and_budgets() -> None:
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    assert "always a 200" not in text
    assert "structured output, streaming, tools, images" in text
    assert "| **Budget** |" in text


def test_readme_tells_the_port_the_token_and_the_cost() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python3 dev.py demo 8010" in text
    assert "with the API token,\n`GET /health/`" in text
    assert '"cost_usd"' in text


def test_mkdocs_serve_does_not_take_the_demo_port() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config.get("dev_addr", "127.0.0.1:8000") != "127.0.0.1:8000"


def test_pyproject_has_the_demo_extra_the_docs_name() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    assert "demo" in extras
