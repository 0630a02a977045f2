"""Steps in the configuration file (docs/configuration.md, docs/strategies.md): apply,
export byte for byte, the dry-run diff, and what the file refuses."""

from __future__ import annotations

import pytest

from llm_routing.config_io import ConfigError, apply, export
from llm_routing.models import Chain, ChainEntry, Provider, group_steps

pytestmark = pytest.mark.django_db

STEPS = """\
# django-llm-routing configuration (format version 1), written by llm_routing_export.
# Keys never appear here: api_key_env names the environment variable that holds one.

version = 1

[providers.anthropic]
kind = "anthropic"
model = "claude-sonnet-4-5"
api_key_env = "ANTHROPIC_API_KEY"
context_window = 200000

[providers.oa-key1]
kind = "openai"
model = "gpt-4o-mini"
api_key_env = "OPENAI_KEY_1"

[providers.oa-key2]
kind = "openai"
model = "gpt-4o-mini"
api_key_env = "OPENAI_KEY_2"

[providers.oa-key3]
kind = "openai"
model = "gpt-4o-mini"
api_key_env = "OPENAI_KEY_3"

[chains.main]
is_default = true
entries = [
    { any = [
    "oa-key1",
    { provider = "oa-key2", weight = 0.25 },
    { provider = "oa-key3", weight = 1e-06 },
], strategy = "weighted" },
    "anthropic",
]
"""


def test_steps_apply_and_export_byte_for_byte():
    changes = apply(STEPS)
    assert {c.name for c in changes} == {"anthropic", "oa-key1", "oa-key2", "oa-key3", "main"}
    rows = list(ChainEntry.objects.filter(chain__name="main").order_by("position"))
    assert [(e.provider.name, e.step, e.weight, e.strategy) for e in rows] == [
        ("oa-key1", 0, 1.0, "weighted"),
        ("oa-key2", 0, 0.25, "weighted"),
        ("oa-key3", 0, 1e-06, "weighted"),
        ("anthropic", None, 1.0, ""),
    ]
    assert [[e.provider.name for e in g] for g in group_steps(rows)] == [
        ["oa-key1", "oa-key2", "oa-key3"],
        ["anthropic"],
    ]
    assert Provider.objects.get(name="anthropic").context_window == 200_000
    assert export() == STEPS
    assert apply(STEPS) == []  # idempotent
    assert export() == STEPS


def test_dry_run_diff_names_the_step_change():
    apply(STEPS)
    changed = STEPS.replace('strategy = "weighted"', 'strategy = "least_in_flight"').replace(
        "weight = 0.25", "weight = 0"
    )
    changes = apply(changed, dry_run=True)
    assert [(c.action, c.kind, c.name) for c in changes] == [("~", "chain", "main")]
    detail = " ".join(changes[0].details)
    assert "least_in_flight" in detail and "weight=0.0" in detail
    assert export() == STEPS  # a dry run writes nothing
    apply(changed)
    assert set(ChainEntry.objects.filter(step=0).values_list("strategy", flat=True)) == {
        "least_in_flight"
    }


def test_an_admin_made_step_exports_and_round_trips():
    apply(STEPS)
    chain = Chain.objects.get(name="main")
    # The admin numbers steps freely; the file writes the structure, not the number.
    ChainEntry.objects.filter(chain=chain, step=0).update(step=7, strategy="cost")
    text = export()
    assert '], strategy = "cost" }' in text
    apply(text)
    assert export() == text


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ('[{ any = ["oa-key1"], strategy = "random" }]', "strategy: expected one of"),
        ("[{ any = [] }]", "any: expected a non-empty array"),
        ('[{ any = ["oa-key1"], weight = 2 }]', "unknown field(s) weight"),
        ('[{ provider = "oa-key1", step = 3 }]', "step: set by the file's structure"),
        ('[{ any = ["oa-key1", "oa-key1"] }]', "appears twice"),
        ('[{ any = [{ provider = "oa-key1", weight = -1 }] }]', "weight"),
    ],
)
def test_bad_steps_are_refused(entries: str, message: str):
    base = STEPS.split("[chains.main]")[0]
    with pytest.raises(ConfigError) as info:
        apply(base + f"[chains.bad]\nentries = {entries}\n")
    assert message in str(info.value)


HEDGED = """\
# django-llm-routing configuration (format version 1), written by llm_routing_export.
# Keys never appear here: api_key_env names the environment variable that holds one.

version = 1

[providers.a]
kind = "openai"
model = "gpt-4o-mini"
api_key_env = "OPENAI_KEY_1"

[providers.b]
kind = "openai"
model = "gpt-4o-mini"
api_key_env = "OPENAI_KEY_2"

[chains.main]
is_default = true
hedge_after_ms = {hedge}
entries = [
    "a",
    "b",
]
"""


@pytest.mark.parametrize(("hedge", "stored"), [("400", "400"), ('"p95"', "p95")])
def test_hedge_after_ms_applies_and_exports_byte_for_byte(hedge: str, stored: str) -> None:
    text = HEDGED.replace("{hedge}", hedge)
    apply(text)
    assert Chain.objects.get(name="main").hedge_after_ms == stored
    assert export() == text
    assert apply(text) == []  # nothing to change


@pytest.mark.parametrize("hedge", ['"400"', "0", "-5", '"p99"', "true", "1.5", "700000"])
def test_hedge_after_ms_refuses_anything_but_milliseconds_or_p95(hedge: str) -> None:
    with pytest.raises(ConfigError):
        apply(HEDGED.replace("{hedge}", hedge))


def test_no_hedge_after_ms_is_not_written() -> None:
    apply(HEDGED.replace("hedge_after_ms = {hedge}\n", ""))
    assert Chain.objects.get(name="main").hedge_after_ms == ""
    assert "hedge_after_ms" not in export()
