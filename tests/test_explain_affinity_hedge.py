"""Explain shows what an affinity key would do in each step of several (read from the
routing cache, never written) and whether the first attempt would be hedged, when and
with whom — in Python, in ``GET /audit/explain/`` and on the admin's explain page
(docs/strategies.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.urls import reverse

from llm_routing import balance
from llm_routing.models import Chain, ChainEntry, Provider
from llm_routing.router import explain
from llm_routing.types import AuditRequest

from .conftest import make_provider

pytestmark = pytest.mark.django_db

KEY = "conversation-7"


class Store:
    """A routing-cache stand-in that records every write."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.writes = 0

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, timeout: float | None = None) -> None:
        self.values[key] = value
        self.writes += 1


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Store:
    fake = Store()
    monkeypatch.setattr(balance, "routing_cache", lambda: fake)
    return fake


@pytest.fixture(autouse=True)
def _fresh_latencies() -> Iterator[None]:
    balance.reset()
    yield
    balance.reset()


def chain(*steps: Any, hedge: str = "") -> Chain:
    """A default chain of scripted providers; a step is a name or (strategy, [names])."""
    row = Chain.objects.create(name="main", is_default=True, hedge_after_ms=hedge)
    position = 0
    for index, step in enumerate(steps):
        names = [step] if isinstance(step, str) else step[1]
        for name in names:
            ChainEntry.objects.create(
                chain=row,
                provider=make_provider(name),
                position=position,
                step=None if isinstance(step, str) else index,
                strategy="" if isinstance(step, str) else step[0],
            )
            position += 1
    return row


def remember(store: Store, name: str, step: int = 0) -> None:
    store.set(balance.affinity_cache_key("main", step, KEY), name)


def turn(**fields: Any) -> AuditRequest:
    return AuditRequest(task="t", input_text="", **fields)


# --- affinity ----------------------------------------------------------------------------


def test_without_a_key_explain_reads_no_affinity(scripted, key_env, store) -> None:
    chain(("weighted", ["a", "b"]), "c")
    remember(store, "b")
    reads = []
    store.get = lambda key, default=None: reads.append(key)  # type: ignore[method-assign]
    ex = explain(turn())
    assert ex.affinity is None and ex.to_dict()["affinity"] is None
    assert ex.picks[0]["reason"] == "weighted" and reads == []


def test_nothing_remembered_yet(scripted, key_env, store) -> None:
    chain(("weighted", ["a", "b"]), "c")
    ex = explain(turn(affinity=KEY))
    (pick,) = ex.picks
    assert pick["reason"] == "weighted"
    assert [a.to_dict() for a in ex.affinity] == [
        {"step": 0, "remembered": None, "serves": pick["picked"], "outcome": "new"}
    ]
    assert store.writes == 0  # read, never written


@pytest.mark.parametrize("home", ["a", "b"])
def test_the_key_is_kept_on_the_remembered_candidate(scripted, key_env, store, home) -> None:
    chain(("weighted", ["a", "b"]), "c")
    remember(store, home)
    for seed in ("00000000-0000-4000-a000-000000000001", "00000000-0000-4000-a000-000000000002"):
        ex = explain(turn(affinity=KEY), request_id=seed)  # whatever the draw
        (pick,) = ex.picks
        assert pick["reason"] == "affinity" and pick["picked"] == home
        assert ex.first_try is not None and ex.first_try.provider == home
        assert [a.to_dict() for a in ex.affinity] == [
            {"step": 0, "remembered": home, "serves": home, "outcome": "kept"}
        ]
    assert store.writes == 1  # remember() only


def test_the_key_moves_when_the_remembered_candidate_is_unavailable(
    scripted, key_env, store
) -> None:
    chain(("weighted", ["a", "b"]), "c")
    remember(store, "b")
    Provider.objects.filter(name="b").update(enabled=False)
    ex = explain(turn(affinity=KEY))
    # As the walk: b goes first on its affinity, is skipped, and a answers.
    assert ex.picks[0]["reason"] == "affinity" and ex.picks[0]["picked"] == "b"
    assert [(c.provider, c.verdict) for c in ex.candidates][:2] == [("b", "skip"), ("a", "try")]
    assert [a.to_dict() for a in ex.affinity] == [
        {"step": 0, "remembered": "b", "serves": "a", "outcome": "moved"}
    ]


def test_a_drained_remembered_candidate_loses_the_key(scripted, key_env, store) -> None:
    chain(("weighted", ["a", "b"]), "c")
    ChainEntry.objects.filter(provider__name="b").update(weight=0)
    remember(store, "b")
    ex = explain(turn(affinity=KEY))
    assert ex.picks[0]["reason"] == "weighted" and ex.picks[0]["picked"] == "a"
    assert ex.affinity[0].to_dict() == {
        "step": 0, "remembered": "b", "serves": "a", "outcome": "moved"
    }  # fmt: skip


def test_the_api_takes_the_key_as_a_parameter_or_the_header(scripted, key_env, store, api) -> None:
    chain(("weighted", ["a", "b"]), "c")
    remember(store, "b")
    url = "/audit/explain/"
    kept = {"step": 0, "remembered": "b", "serves": "b", "outcome": "kept"}
    by_field = api.get(url, {"task": "t", "affinity": KEY}).json()
    assert by_field["affinity"] == [kept] and by_field["picks"][0]["reason"] == "affinity"
    by_header = api.get(url, {"task": "t"}, HTTP_X_LLM_AFFINITY=KEY).json()
    assert by_header["affinity"] == [kept]
    assert api.get(url, {"task": "t"}).json()["affinity"] is None
    Provider.objects.filter(name="b").update(enabled=False)
    moved = api.get(url, {"task": "t", "affinity": KEY}).json()["affinity"]
    assert moved == [{"step": 0, "remembered": "b", "serves": "a", "outcome": "moved"}]
    assert api.get(url, {"task": "t", "affinity": "x" * 257}).status_code == 400
    assert api.get(url, {"task": "t", "affinity": "a\x01b"}).status_code == 400
    assert store.writes == 1


# --- hedging -----------------------------------------------------------------------------


def hedge_of(ex: Any) -> dict[str, Any]:
    return dict(ex.to_dict()["hedge"])


def test_a_hedge_after_a_number(scripted, key_env) -> None:
    chain("a", "b", "c", hedge="400")
    assert hedge_of(explain(turn())) == {
        "hedge_after_ms": 400, "after_ms": 400.0, "primary": "a", "candidate": "b",
        "reason": None,
    }  # fmt: skip


def test_a_hedge_after_p95_with_and_without_samples(scripted, key_env) -> None:
    chain("a", "b", hedge="p95")
    before = hedge_of(explain(turn()))
    assert before == {"hedge_after_ms": "p95", "after_ms": None, "primary": "a",
                      "candidate": "b", "reason": "no_p95_yet"}  # fmt: skip
    for i in range(balance.P95_MIN_SAMPLES):
        balance.observe_answer("a", 100.0 + i)
    after = hedge_of(explain(turn()))
    assert after["after_ms"] == balance.p95("a") == 118.0 and after["reason"] is None
    assert after["candidate"] == "b"


def test_no_hedge_without_the_setting(scripted, key_env) -> None:
    chain("a", "b")
    assert hedge_of(explain(turn())) == {
        "hedge_after_ms": None, "after_ms": None, "primary": "a", "candidate": "b",
        "reason": "not_configured",
    }  # fmt: skip


def test_the_hedge_is_the_next_candidate_the_walk_would_try(scripted, key_env) -> None:
    # The rest of the primary's step first: within a step of several, its next member.
    chain(("weighted", ["a", "b"]), "c", hedge="400")
    ex = explain(turn())
    first, second = (c.provider for c in ex.candidates[:2])
    assert hedge_of(ex)["primary"] == first and hedge_of(ex)["candidate"] == second


def test_why_no_hedge(scripted, key_env) -> None:
    chain("a", "b", "c", hedge="400")
    Provider.objects.filter(name="b").update(enabled=False)
    # The walk looks for the hedge in the next step only (b): it would be skipped.
    assert hedge_of(explain(turn()))["reason"] == "unavailable"
    # A stream hedges too (its first token), so no reason of its own: here the scripted
    # rows declare no streaming, the mock would serve it, and the mock is never hedged.
    streamed = explain(turn(stream=True))
    assert {c.reason for c in streamed.candidates[:3]} == {"unsupported", "disabled"}
    assert hedge_of(streamed)["reason"] == "mock"
    assert hedge_of(explain(turn(force_provider="a")))["reason"] == "forced"
    Provider.objects.filter(name="b").update(enabled=True)
    Provider.objects.filter(name="a").update(enabled=False)
    assert hedge_of(explain(turn())) == {
        "hedge_after_ms": 400, "after_ms": 400.0, "primary": "b", "candidate": "c",
        "reason": None,
    }  # fmt: skip


def test_the_mock_is_never_the_hedge(scripted, key_env) -> None:
    chain("a", hedge="400")  # then the mock backstop
    ex = explain(turn())
    assert [c.provider for c in ex.candidates] == ["a", "mock"]
    assert hedge_of(ex)["candidate"] is None and hedge_of(ex)["reason"] == "no_candidate"


def test_the_budget_and_the_deadline_that_cannot_afford_a_hedge(
    scripted, key_env, settings
) -> None:
    chain("a", "b", hedge="400")
    settings.LLM_ROUTING = {**settings.LLM_ROUTING, "MAX_ATTEMPTS": 1}
    assert hedge_of(explain(turn()))["reason"] == "attempt_budget"
    settings.LLM_ROUTING = {**settings.LLM_ROUTING, "MAX_ATTEMPTS": 4, "REQUEST_DEADLINE_S": 0.7}
    assert hedge_of(explain(turn()))["reason"] == "deadline"


def test_the_api_shows_the_hedge(scripted, key_env, api) -> None:
    chain("a", "b", hedge="p95")
    body = api.get("/audit/explain/", {"task": "t"}).json()
    assert body["hedge"] == {"hedge_after_ms": "p95", "after_ms": None, "primary": "a",
                             "candidate": "b", "reason": "no_p95_yet"}  # fmt: skip


# --- the admin page ----------------------------------------------------------------------


def test_the_admin_page_shows_affinity_and_hedging(scripted, key_env, store, admin_client):
    chain(("weighted", ["a", "b"]), "c", hedge="400")
    remember(store, "b")
    url = reverse("admin:llm_routing_explain")
    html = admin_client.get(url, {"task": "t", "affinity": KEY}).content.decode()
    assert 'id="id_affinity"' in html and f'value="{KEY}"' in html
    assert 'id="llmr-picks"' in html and 'id="llmr-affinity"' in html
    assert "kept: back to the candidate that served it last" in html
    assert 'id="llmr-hedge"' in html and "400.0 ms" in html
    assert "<strong>a</strong>, if the first attempt has not answered" in html
    Provider.objects.filter(name="b").update(enabled=False)
    html = admin_client.get(url, {"task": "t", "affinity": KEY}).content.decode()
    assert "moved: the remembered candidate is unavailable" in html
    plain = admin_client.get(url, {"task": "t"}).content.decode()
    assert 'id="llmr-affinity"' not in plain
    Chain.objects.filter(name="main").update(hedge_after_ms="p95")
    html = admin_client.get(url, {"task": "t"}).content.decode()
    assert "no p95 yet" in html and "no p95 of the first attempt" in html
    assert store.writes == 1
