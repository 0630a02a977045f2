"""``[[budgets]]`` in the configuration file (docs/budgets.md): apply, export, round
trip, prune, and validation errors that name the field."""

from __future__ import annotations

from decimal import Decimal

import pytest

from llm_routing.config_io import ConfigError, apply, export
from llm_routing.models import Budget

pytestmark = pytest.mark.django_db

FILE = """
version = 1

[[budgets]]
name = "alice-daily"
scope = "user"          # user | group | token | global
subject = "alice"       # username, group name or token key; omitted for global
window = "day"          # minute | hour | day | month
max_requests = 50       # any of max_requests, max_tokens, max_cost_usd

[[budgets]]
name = "everyone-monthly"
scope = "global"
window = "month"
max_tokens = 2000000
max_cost_usd = 12.5
soft_threshold = 0.9
on_cache_down = "closed"
"""


def test_apply_creates_budgets_and_export_round_trips():
    changes = apply(FILE)
    assert [(c.action, c.kind, c.name) for c in changes] == [
        ("+", "budget", "alice-daily"),
        ("+", "budget", "everyone-monthly"),
    ]
    alice = Budget.objects.get(name="alice-daily")
    assert (alice.scope, alice.subject, alice.window, alice.max_requests) == (
        "user",
        "alice",
        "day",
        50,
    )
    assert alice.max_tokens is None and alice.soft_threshold == 0.8 and alice.enabled
    everyone = Budget.objects.get(name="everyone-monthly")
    assert everyone.max_cost_usd == Decimal("12.5") and everyone.on_cache_down == "closed"

    text = export()
    assert "[[budgets]]" in text
    assert 'name = "alice-daily"\nscope = "user"\nsubject = "alice"\nwindow = "day"\n' in text
    assert "max_cost_usd = 12.5" in text
    assert apply(text) == []  # apply → export → apply changes nothing
    Budget.objects.all().delete()
    apply(text)
    assert export() == text  # byte for byte


def test_changes_are_planned_and_prune_removes_budgets():
    apply(FILE)
    changed = FILE.replace("max_requests = 50", "max_requests = 60")
    changes = apply(changed, dry_run=True)
    assert [str(c) for c in changes] == ["~ budget alice-daily: max_requests 50 -> 60"]
    assert Budget.objects.get(name="alice-daily").max_requests == 50  # dry run
    apply(changed)
    assert Budget.objects.get(name="alice-daily").max_requests == 60
    only_alice = changed.split('[[budgets]]\nname = "everyone')[0]
    assert [str(c) for c in apply(only_alice)] == []  # without prune: kept
    assert [str(c) for c in apply(only_alice, prune=True)] == ["- budget everyone-monthly"]
    assert list(Budget.objects.values_list("name", flat=True)) == ["alice-daily"]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('name = "b"\nscope = "user"\nsubject = "x"', "budgets.b.max_requests: Set at least one"),
        ('name = "b"\nscope = "global"\nsubject = "x"\nmax_requests = 1', "budgets.b.subject:"),
        ('name = "b"\nscope = "user"\nmax_requests = 1', "budgets.b.subject: Required"),
        ('name = "b"\nscope = "team"\nsubject = "x"\nmax_requests = 1', "budgets.b.scope:"),
        ('name = "b"\nscope = "global"\nwindow = "week"\nmax_requests = 1', "budgets.b.window:"),
        ('name = "b"\nscope = "global"\nmax_requests = "5"', "budgets.b.max_requests: expected"),
        ('name = "b"\nscope = "global"\nmax_cost_usd = "1"', "budgets.b.max_cost_usd: expected"),
        ('name = "b"\nscope = "global"\nmax_requests = 1\ncap = 2', "budgets.b: unknown field"),
        ('scope = "global"\nmax_requests = 1', "budgets[0].name: required"),
        (
            'name = "b"\nscope = "global"\nmax_requests = 1\nsoft_threshold = 1.5',
            "budgets.b.soft_threshold:",
        ),
    ],
)
def test_validation_errors_name_the_field(table, message):
    with pytest.raises(ConfigError) as exc:
        apply(f"version = 1\n\n[[budgets]]\n{table}\n")
    assert any(e.startswith(message) for e in exc.value.errors), exc.value.errors
    assert not Budget.objects.exists()


def test_a_budget_named_twice_and_budgets_not_an_array_are_refused():
    twice = 'version = 1\n[[budgets]]\nname = "b"\nscope = "global"\nmax_requests = 1\n' * 1
    twice += '[[budgets]]\nname = "b"\nscope = "global"\nmax_requests = 2\n'
    with pytest.raises(ConfigError) as exc:
        apply(twice)
    assert exc.value.errors == ["budgets[1].name: budget 'b' appears twice."]
    with pytest.raises(ConfigError) as exc:
        apply('version = 1\n[budgets.b]\nscope = "global"\n')
    assert exc.value.errors == ["budgets: expected an array of tables ([[budgets]])."]
