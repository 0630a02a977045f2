"""The dashboard's "Steps" and "Hedges" panels (docs/admin.md, "Dashboard"): the split of
served answers per candidate of each step of several, beside the configured weight
share; per hedging chain, requests hedged, won, lost, failed, skipped (by reason) and
the hedge rate. Rows come from the real router (scripted providers for the steps, the
fake upstream for the hedges) or are created directly as in test_admin_dashboard.py."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from llm_routing import balance, dashboard, snapshot
from llm_routing.dashboard_steps import hedges, step_splits
from llm_routing.errors import UnavailableError
from llm_routing.models import Attempt, Chain, ChainEntry, Provider, RoutingDecision
from llm_routing.router import route
from llm_routing.types import AuditRequest
from tests.fakes.upstream import FakeUpstream, Faults

from .conftest import make_provider, upstream_fields
from .test_admin_dashboard import DASHBOARD

pytestmark = pytest.mark.django_db

DOWN = UnavailableError("down", http_status=503)


def stepped(name: str, members: dict[str, float], *, strategy: str = "weighted",
            after: tuple[str, ...] = ("c",), is_default: bool = True) -> Chain:  # fmt: skip
    """A chain whose first step holds ``members`` (name -> weight), then ``after``, each
    a step of its own."""
    chain = Chain.objects.create(name=name, is_default=is_default)
    position = 0
    for provider, weight in members.items():
        ChainEntry.objects.create(
            chain=chain, provider=make_provider(provider, max_retries=0), position=position, step=1,
            weight=weight, strategy=strategy,
        )  # fmt: skip
        position += 1
    for provider in after:
        row = Provider.objects.filter(name=provider).first() or make_provider(provider)
        ChainEntry.objects.create(chain=chain, provider=row, position=position)
        position += 1
    return chain


def served_step(name: str) -> tuple[str, int | None]:
    """(provider, step) of the attempt that served the last decision named ``name``."""
    row = Attempt.objects.get(decision__request_id=name, served=True)
    return row.provider, row.step


def test_the_split_of_a_weighted_step_counts_what_the_router_served(scripted, key_env):
    stepped("main", {"a": 3.0, "b": 1.0})
    stepped("quiet", {"p": 1.0, "q": 1.0}, strategy="latency", after=(), is_default=False)
    Chain.objects.create(name="plain")  # no step of several: not listed
    # b's first two calls fail: its step's other candidate answers them (still step 0).
    scripted.scripts["b"] = [DOWN, DOWN, "ok"]
    served = Counter()
    for _ in range(40):
        routed = route(AuditRequest(task="t", input_text="hi"), sleeper=lambda s: None)
        provider, step = served_step(routed.request_id)
        served[(provider, step)] += 1
    assert set(served) <= {("a", 0), ("b", 0)}  # every answer came from the first step
    board = dashboard.build("1h")
    main, quiet = board.steps
    assert (main.chain, main.step, main.strategy) == ("main", 0, "weighted")
    assert main.served == 40
    split = {c.provider: c for c in main.candidates}
    assert [c.provider for c in main.candidates] == ["a", "b"]
    assert split["a"].served == served[("a", 0)] and split["b"].served == served[("b", 0)]
    assert split["a"].share == pytest.approx(served[("a", 0)] / 40)
    assert split["a"].weight == 3.0 and split["a"].weight_share == pytest.approx(0.75)
    assert split["b"].weight_share == pytest.approx(0.25)
    assert split["a"].drift == pytest.approx(served[("a", 0)] / 40 - 0.75)
    # A step of another strategy: no configured share; no traffic: zeros, not an error.
    assert (quiet.chain, quiet.strategy, quiet.served) == ("quiet", "latency", 0)
    assert [(c.provider, c.served, c.share, c.weight_share) for c in quiet.candidates] == [
        ("p", 0, 0.0, None),
        ("q", 0, 0.0, None),
    ]


def test_a_provider_no_longer_in_the_step_is_listed_apart(scripted, key_env):
    stepped("main", {"a": 1.0, "b": 1.0})
    row = RoutingDecision.objects.create(
        task="t", router_mode="default", mode="live", input_length=1, input_sha256="0" * 64,
        status="ok", chain_name="main", selected_provider="old",
    )  # fmt: skip
    Attempt.objects.create(decision=row, index=0, provider="old", outcome="ok", served=True,
                           step=0)  # fmt: skip
    (main,) = dashboard.build("1h").steps
    assert [(c.provider, c.served, c.weight, c.weight_share) for c in main.candidates] == [
        ("a", 0, 1.0, 0.5),
        ("b", 0, 1.0, 0.5),
        ("old", 1, None, None),
    ]
    assert main.candidates[2].share == 1.0


def test_no_step_of_several_no_steps_panel_rows():
    assert dashboard.build("1h").steps == []


# --- hedges ------------------------------------------------------------------------------

REQUEST = AuditRequest(task="summarize", input_text="Hedge the slow ones.")
KINDS = {"a": "openai", "b": "anthropic", "c": "gemini"}


@pytest.fixture
def _fresh_latencies() -> Iterator[None]:
    balance.reset()
    yield
    balance.reset()


def hedging(fake: FakeUpstream, name: str = "main", *, is_default: bool = True) -> Chain:
    """As tests/test_hedging.py: a chain of a (OpenAI), b (Anthropic), c (Gemini) on the
    fake upstream, each a step of its own, hedged after 100 ms."""
    row = Chain.objects.create(name=name, is_default=is_default, hedge_after_ms="100")
    for position, provider in enumerate(("a", "b", "c")):
        fields = upstream_fields(provider, KINDS[provider], fake)
        fields.update({"model": provider, "max_retries": 0})
        ChainEntry.objects.create(chain=row, provider=Provider.objects.create(**fields),
                                  position=position)  # fmt: skip
    return row


def hedge_traffic(fake: FakeUpstream, settings: Any, chain: str | None = None) -> Counter[str]:
    """Five requests through the router on a :func:`hedging` chain: a hedge won, one
    lost, one failed, one skipped (no attempt left), one request not hedged. Returns
    ``routing_metadata.hedge`` counted over them."""
    request = dataclasses.replace(REQUEST, chain=chain)
    seen: Counter[str] = Counter()

    def one() -> None:
        seen[route(request).metadata.hedge or ""] += 1

    # won: the primary is slow, the hedge answers.
    fake.script("openai", Faults.slow(3.0))
    fake.script("anthropic", Faults.slow(0.05))
    one()
    # lost: the primary answers before the slow hedge.
    fake.script("openai", Faults.slow(0.4))
    fake.script("anthropic", Faults.slow(3.0))
    one()
    # failed: both fail (the walk goes on to c).
    fake.script("openai", dataclasses.replace(Faults.unavailable("openai"), delay=0.3))
    fake.script("anthropic", dataclasses.replace(Faults.unavailable("anthropic"), delay=0.3))
    one()
    # skipped: no attempt left for a hedge.
    fake.script("openai", Faults.slow(0.4))
    with override_settings(LLM_ROUTING={**settings.LLM_ROUTING, "MAX_ATTEMPTS": 1}):
        one()
    # not hedged: the primary answers at once.
    one()
    return seen


@pytest.mark.usefixtures("driver", "key_env", "_fresh_latencies")
def test_hedges_counted_from_requests_the_router_hedged(fake_upstream, settings):
    hedging(fake_upstream)
    Chain.objects.create(name="steady")  # no hedge_after_ms: not listed
    expected = hedge_traffic(fake_upstream, settings)
    assert expected == {"won": 1, "lost": 1, "failed": 1, "skipped": 1, "": 1}
    (row,) = dashboard.build("1h").hedges
    assert (row.chain, row.hedge_after, row.requests) == ("main", "100", 5)
    assert row.counts == {"won": 1, "lost": 1, "failed": 1, "skipped": 1}
    assert row.hedged == 3 and row.rate == pytest.approx(3 / 5)
    assert row.skip_reasons == (("attempt_budget", 1),)


def decision(chain: str, hedge: str = "", *, age: timedelta = timedelta(minutes=1),
             skipped: tuple[str, ...] = ()) -> RoutingDecision:  # fmt: skip
    row = RoutingDecision.objects.create(
        task="t", router_mode="default", mode="live", input_length=1, input_sha256="0" * 64,
        status="ok", chain_name=chain, selected_provider="a", hedge=hedge,
    )  # fmt: skip
    RoutingDecision.objects.filter(pk=row.pk).update(created_at=timezone.now() - age)
    Attempt.objects.create(decision=row, index=0, provider="a", outcome="ok", served=True, step=0)
    for i, reason in enumerate(skipped, start=1):
        Attempt.objects.create(decision=row, index=i, provider="b", outcome="hedge_skipped",
                               reason=reason, step=1)  # fmt: skip
    return row


@pytest.fixture
def hedge_history() -> None:
    Chain.objects.create(name="main", hedge_after_ms="p95")
    Chain.objects.create(name="fast", hedge_after_ms="250")
    for hedge in ("won", "won", "won", "lost", "failed", "", "", ""):
        decision("main", hedge)
    decision("main", "skipped", skipped=("deadline",))
    decision("main", "skipped", skipped=("deadline",))
    decision("main", "skipped", skipped=("attempt_budget",))
    decision("main", "won", age=timedelta(hours=3))  # outside the last hour
    decision("other", "")  # a chain that does not hedge
    decision("retired", "lost")  # hedged in the window, hedges no more


def test_hedges_per_chain_with_rates_and_skip_reasons(hedge_history):
    rows = {r.chain: r for r in dashboard.build("1h").hedges}
    assert list(rows) == ["fast", "main", "retired"]  # hedging now first, by name
    main = rows["main"]
    assert (main.hedge_after, main.requests, main.hedged) == ("p95", 11, 5)
    assert main.counts == {"won": 3, "lost": 1, "failed": 1, "skipped": 3}
    assert main.rate == pytest.approx(5 / 11)
    assert main.skip_reasons == (("deadline", 2), ("attempt_budget", 1))
    assert (rows["fast"].requests, rows["fast"].hedged, rows["fast"].rate) == (0, 0, 0.0)
    assert rows["retired"].hedge_after == "" and rows["retired"].counts["lost"] == 1
    day = {r.chain: r for r in dashboard.build("24h").hedges}
    assert day["main"].counts["won"] == 4 and day["main"].requests == 12


def test_the_panels_cost_a_fixed_number_of_queries(
    hedge_history, django_assert_num_queries, scripted, key_env
):
    stepped("stepped", {"x": 1.0, "y": 2.0}, is_default=False)
    for _ in range(5):
        route(AuditRequest(task="t", input_text="hi", chain="stepped"), sleeper=lambda s: None)
    snapshot.current()  # the configuration as the router reads it (cached)
    since = timezone.now() - timedelta(hours=1)
    part = dashboard.window_slice(since)
    assert part is not None
    with django_assert_num_queries(1):
        (split,) = step_splits(part.where)
    assert split.served == 5
    with django_assert_num_queries(2):  # outcomes; reasons (there were skipped hedges)
        assert len(hedges(since)) == 3
    for _ in range(20):  # more rows, the same queries
        decision("main", "skipped", skipped=("deadline",))
        route(AuditRequest(task="t", input_text="hi", chain="stepped"), sleeper=lambda s: None)
    snapshot.current()
    with django_assert_num_queries(1):
        assert step_splits(part.where)[0].served == 25
    with django_assert_num_queries(2):
        hedges(since)
    # The whole dashboard: the window's first and last decision ids, the summary, three
    # Attempt charts, spend, steps, hedges and their skip reasons — whatever the rows.
    with django_assert_num_queries(10):
        dashboard.build("1h")


def test_no_skipped_hedge_no_reasons_query(django_assert_num_queries):
    Chain.objects.create(name="main", hedge_after_ms="100")
    decision("main", "won")
    snapshot.current()
    with django_assert_num_queries(1):
        (row,) = hedges(timezone.now() - timedelta(hours=1))
    assert row.counts["won"] == 1 and row.skip_reasons == ()


def test_a_sampled_window_scales_the_step_counts(scripted, key_env, monkeypatch):
    stepped("main", {"a": 1.0, "b": 1.0})
    for _ in range(8):
        route(AuditRequest(task="t", input_text="hi"), sleeper=lambda s: None)
    monkeypatch.setattr(dashboard, "SAMPLE_DECISIONS", 2)
    monkeypatch.setattr(dashboard, "SAMPLE_BLOCKS", 2)
    board = dashboard.build("1h")
    assert board.sampled_decisions == 2
    (main,) = board.steps
    assert main.served == 8  # 2 sampled answers x 4
    assert sum(c.share for c in main.candidates) == pytest.approx(1.0)


# --- the page ------------------------------------------------------------------------------


def panel(html: str, name: str) -> str:
    start = html.index(f'id="llmr-{name}"')
    return html[start : html.index("</section>", start)]


def test_the_page_shows_both_panels(admin_client, hedge_history, scripted, key_env):
    stepped("stepped", {"x": 1.0, "y": 3.0}, is_default=False)
    scripted.scripts["x"] = [DOWN, "ok"]  # the first x pick fails over to y
    for _ in range(4):
        route(AuditRequest(task="t", input_text="hi", chain="stepped"), sleeper=lambda s: None)
    html = admin_client.get(reverse(DASHBOARD), {"window": "1h"}).content.decode()
    steps = panel(html, "steps")
    assert "stepped, step 0: <strong>weighted</strong>" in steps
    assert "4 answers served" in steps
    assert ">Configured</th>" in steps and ">25.0 %</td>" in steps and ">75.0 %</td>" in steps
    (split,) = dashboard.build("1h").steps
    for c in split.candidates:  # each candidate's count and share, as the router served
        assert f'<td>{c.provider}</td><td class="llmr-num">{c.served}</td>' in steps
        assert f'<td class="llmr-num">{100 * c.share:.1f} %</td>' in steps
    assert 'class="llmr-split-mark" style="left: 25.0%"' in steps
    hedges_html = panel(html, "hedges")
    main_row = hedges_html[hedges_html.index("<td>main</td>") :].split("</tr>")[0]
    cells = [c.split(">", 1)[1].split("<")[0] for c in main_row.split("<td")[1:]]
    assert cells[:7] == ["main", "p95", "11", "5", "3", "1", "1"]
    assert "out of time" in main_row and 'title="deadline"' in main_row
    assert "45.5 %" in main_row  # 5 of 11
    assert "<td>retired</td><td>off now</td>" in hedges_html
    # The attempts chart has the hedge outcomes in its legend when there are some.
    Attempt.objects.create(
        decision=RoutingDecision.objects.filter(chain_name="main").first(), index=9,
        provider="b", outcome="hedge_lost", reason="hedge_lost", step=1,
    )  # fmt: skip
    html = admin_client.get(reverse(DASHBOARD), {"window": "1h"}).content.decode()
    assert ">hedge_lost</text>" in html and ">hedge_skipped</text>" in html


def test_empty_panels_say_what_to_configure(admin_client):
    html = admin_client.get(reverse(DASHBOARD), {"window": "1h"}).content.decode()
    assert "No chain has a step of several entries" in panel(html, "steps")
    assert "same <strong>step</strong> number on the Chain page" in panel(html, "steps")
    assert "No chain hedges. Set <strong>Hedge after ms</strong>" in panel(html, "hedges")


def test_the_decision_page_says_how_its_hedge_went(admin_client):
    row = decision("main", "won")
    html = admin_client.get(
        reverse("admin:llm_routing_routingdecision_change", args=[row.pk])
    ).content.decode()
    assert "Hedge:" in html and ">won<" in html


@pytest.mark.services
def test_the_panels_on_postgresql(hedge_history, scripted, key_env):
    """The same aggregates on PostgreSQL (services suite): the join of the served
    attempts to their decision, the distinct count of the skip reasons."""
    from django.db import connection

    assert connection.vendor == "postgresql"
    test_hedges_per_chain_with_rates_and_skip_reasons(hedge_history)
    stepped("stepped", {"x": 1.0, "y": 3.0}, is_default=False)
    served: Counter[str] = Counter()
    for _ in range(8):
        request = AuditRequest(task="t", input_text="hi", chain="stepped")
        served[route(request, sleeper=lambda s: None).result.provider] += 1
    (split,) = dashboard.build("1h").steps
    assert {c.provider: c.served for c in split.candidates} == {"x": served["x"], "y": served["y"]}
    assert [c.weight_share for c in split.candidates] == [0.25, 0.75]
