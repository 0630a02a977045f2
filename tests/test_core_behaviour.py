"""Behaviour of the routing core that a mutation run showed nothing pinned (issue 17).

Each test states what a caller or operator sees — the recorded attempt, the circuit's
state and health over a fake clock, the stream's end event — so it fails whenever that
behaviour changes, whatever the code change that caused it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from llm_routing.errors import (
    InvalidRequestError,
    NetworkError,
    RateLimitError,
    UnavailableError,
)
from llm_routing.models import Attempt, RoutingDecision
from llm_routing.providers.mock import MockProvider
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import CLOSED, HALF_OPEN, OPEN, Policy
from llm_routing.resilience.budget import Budget
from llm_routing.resilience.retry import call_with_retries
from llm_routing.router import resolve, route, route_stream
from llm_routing.types import (
    AuditRequest,
    ErrorInfo,
    ProviderConfig,
    ProviderResult,
    StreamChunk,
    StreamFailure,
    StreamResult,
)

from .breaker_support import BrokenCache, FakeClock
from .conftest import ScriptedProvider, make_chain, make_provider

# Every routed call in this module runs against both drivers (tests/drivers.py).
pytestmark = pytest.mark.usefixtures("driver")


REQUEST = AuditRequest(task="summarize", input_text="hello")
CONFIG = ProviderConfig(name="primary", kind="openai", model="gpt-x", timeout_s=5.0)
UNAVAILABLE = ErrorInfo(category="unavailable", message="503", http_status=503, transient=True)
BAD_REQUEST = ErrorInfo(category="invalid_request", message="400", http_status=400)


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def result(ok: bool, error: ErrorInfo = UNAVAILABLE) -> ProviderResult:
    return ProviderResult(
        provider=CONFIG.name,
        model=CONFIG.model,
        mode="live" if ok else "error",
        status="ok" if ok else "error",
        error=None if ok else error,
        upstream_requests=1,
    )


def fail(config: ProviderConfig = CONFIG, error: ErrorInfo = UNAVAILABLE) -> None:
    """One finished, failed call as the router reports it."""
    assert breaker.allow(config)
    breaker.observe(config, result(False, error))


def phase(clock: FakeClock, config: ProviderConfig = CONFIG) -> str:
    return breaker.store.load(config.name, config.model).phase(clock())


def health(clock: FakeClock, config: ProviderConfig = CONFIG) -> dict[str, Any]:
    return breaker.store.load(config.name, config.model).health(clock())


@pytest.fixture
def cache_clock(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The fake clock also drives the LocMem cache's expiry (the probe slot's TTL)."""
    fake_time = SimpleNamespace(time=clock)
    monkeypatch.setattr("django.core.cache.backends.base.time", fake_time)
    monkeypatch.setattr("django.core.cache.backends.locmem.time", fake_time)
    return clock


# --- breaker: the half-open probe slot ------------------------------------------------------


@pytest.mark.parametrize(
    ("timeout_s", "probe_ttl", "slot_s"),
    [
        (5.0, None, 10),  # BREAKER_PROBE_TTL_S (10 s) is longer than timeout + 1 s
        (12.2, None, 14),  # timeout + 1 s = 13.2 s, rounded up to whole seconds
        (2.0, 20.5, 21),  # a configured probe TTL, rounded up
    ],
)
def test_a_probe_that_never_reports_frees_the_circuit_after_its_ttl(
    cache_clock: FakeClock, timeout_s: float, probe_ttl: float | None, slot_s: int
) -> None:
    config = replace(CONFIG, timeout_s=timeout_s)
    settings = {} if probe_ttl is None else {"BREAKER_PROBE_TTL_S": probe_ttl}
    with override_settings(LLM_ROUTING=settings):
        for _ in range(3):
            fail(config)
        cache_clock.advance(1.0)
        assert phase(cache_clock, config) == HALF_OPEN
        assert breaker.allow(config)  # the probe starts ... and its worker dies
        cache_clock.advance(slot_s - 0.1)
        assert not breaker.allow(config)  # the slot is still held
        cache_clock.advance(0.1)
        assert breaker.allow(config)  # the slot expired: a new probe may go
        assert breaker.is_probe(config)
        breaker.observe(config, result(True))
    assert phase(cache_clock, config) == CLOSED


def test_a_probe_answered_with_a_client_error_closes_and_resets_the_count(
    clock: FakeClock,
) -> None:
    for _ in range(3):
        fail()
    clock.advance(1.0)
    assert breaker.allow(CONFIG) and breaker.is_probe(CONFIG)
    breaker.observe(CONFIG, result(False, BAD_REQUEST))  # the provider answered: alive
    view = health(clock)
    assert view["state"] == CLOSED and view["consecutive_failures"] == 0
    assert view["last_http_status"] == 400
    fail()  # one later transient failure starts a new count, it does not reopen
    assert phase(clock) == CLOSED and health(clock)["consecutive_failures"] == 1
    assert breaker.allow(CONFIG)


# --- breaker: every setting is read -------------------------------------------------------


def test_breaker_cooldowns_setting_sets_how_long_the_circuit_stays_open(
    clock: FakeClock,
) -> None:
    with override_settings(
        LLM_ROUTING={"BREAKER_COOLDOWNS_S": [7.0, 8.0], "BREAKER_COOLDOWN_MAX_S": 60.0}
    ):
        for _ in range(3):
            fail()
        clock.advance(6.9)
        assert phase(clock) == OPEN
        clock.advance(0.1)
        assert phase(clock) == HALF_OPEN


def test_breaker_cooldown_max_setting_caps_the_cooldown(clock: FakeClock) -> None:
    with override_settings(
        LLM_ROUTING={"BREAKER_COOLDOWNS_S": [30.0], "BREAKER_COOLDOWN_MAX_S": 4.0}
    ):
        for _ in range(3):
            fail()
        clock.advance(3.9)
        assert phase(clock) == OPEN
        clock.advance(0.1)
        assert phase(clock) == HALF_OPEN


def test_breaker_reset_after_setting_ends_a_failure_streak(clock: FakeClock) -> None:
    with override_settings(LLM_ROUTING={"BREAKER_RESET_AFTER_S": 5.0}):
        fail()
        fail()
        clock.advance(5.0)  # quiet for BREAKER_RESET_AFTER_S: the count starts again
        fail()
        assert phase(clock) == CLOSED and health(clock)["consecutive_failures"] == 1
    with override_settings(LLM_ROUTING={"BREAKER_RESET_AFTER_S": 5.1}):
        fail()
        clock.advance(5.0)
        fail()
        assert health(clock)["consecutive_failures"] == 3
        assert phase(clock) == OPEN


def test_retry_after_cap_setting_decides_which_429_opens_at_once(clock: FakeClock) -> None:
    long_429 = ErrorInfo(
        category="rate_limit", message="429", http_status=429, transient=True, retry_after_s=3.0
    )
    with override_settings(LLM_ROUTING={"RETRY_AFTER_CAP_S": 3.0}):
        fail(error=long_429)  # 3 s is within a 3 s cap: counted, not opened
        assert phase(clock) == CLOSED
    with override_settings(LLM_ROUTING={"RETRY_AFTER_CAP_S": 2.0}):
        fail(error=long_429)  # over a 2 s cap: open at once, for the Retry-After
        assert phase(clock) == OPEN
        clock.advance(2.9)
        assert phase(clock) == OPEN
        clock.advance(0.1)
        assert phase(clock) == HALF_OPEN


def test_breaker_retry_after_max_setting_bounds_a_long_retry_after(clock: FakeClock) -> None:
    huge = ErrorInfo(
        category="rate_limit", message="429", http_status=429, transient=True, retry_after_s=100
    )
    with override_settings(LLM_ROUTING={"BREAKER_RETRY_AFTER_MAX_S": 20.0}):
        fail(error=huge)
        clock.advance(19.9)
        assert phase(clock) == OPEN
        clock.advance(0.1)
        assert phase(clock) == HALF_OPEN


def test_policy_reads_every_breaker_setting() -> None:
    with override_settings(
        LLM_ROUTING={
            "BREAKER_FAILURE_THRESHOLD": 4,
            "BREAKER_COOLDOWNS_S": [3, 6],
            "BREAKER_COOLDOWN_MAX_S": 7,
            "BREAKER_RESET_AFTER_S": 8,
            "RETRY_AFTER_CAP_S": 9,
            "BREAKER_RETRY_AFTER_MAX_S": 11,
            "BREAKER_PROBE_TTL_S": 12,
        }
    ):
        assert Policy.from_settings() == Policy(
            threshold=4,
            cooldowns=(3.0, 6.0),
            cooldown_max=7.0,
            reset_after=8.0,
            retry_after_cap=9.0,
            retry_after_max=11.0,
            probe_ttl=12.0,
        )


@pytest.mark.parametrize(
    "overrides",
    [
        {"BREAKER_FAILURE_THRESHOLD": 1},
        {"BREAKER_COOLDOWNS_S": [0.5]},
        {"BREAKER_COOLDOWN_MAX_S": 0.5},
    ],
)
def test_the_smallest_valid_breaker_settings_are_accepted(overrides: dict[str, Any]) -> None:
    with override_settings(LLM_ROUTING=overrides):
        Policy.from_settings()


@pytest.mark.parametrize(
    "overrides",
    [
        {"BREAKER_COOLDOWNS_S": [0.0]},
        {"BREAKER_COOLDOWNS_S": []},
        {"BREAKER_COOLDOWN_MAX_S": 0},
        {"BREAKER_COOLDOWN_MAX_S": -1},
        {"BREAKER_FAILURE_THRESHOLD": 0},
        {"BREAKER_FAILURE_THRESHOLD": -1},
    ],
)
def test_out_of_range_breaker_settings_are_refused(overrides: dict[str, Any]) -> None:
    with override_settings(LLM_ROUTING=overrides), pytest.raises(ImproperlyConfigured):
        Policy.from_settings()


def test_a_threshold_of_one_opens_on_the_first_transient_failure(clock: FakeClock) -> None:
    with override_settings(LLM_ROUTING={"BREAKER_FAILURE_THRESHOLD": 1}):
        fail()
        assert phase(clock) == OPEN


# --- breaker: the process-local fallback while the cache is down ---------------------------


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cache_down(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[Monotonic]:
    """The circuit cache refuses every call; process-local state on a fake monotonic clock."""
    mono = Monotonic()
    monkeypatch.setattr(breaker, "time", SimpleNamespace(monotonic=mono, time=time.time))
    monkeypatch.setattr(BrokenCache, "broken", True)
    BrokenCache._data.clear()
    with override_settings(
        CACHES={
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "broken": {"BACKEND": "tests.breaker_support.BrokenCache"},
        },
        LLM_ROUTING={"CACHE_ALIAS": "broken"},
    ):
        yield mono


def test_with_the_cache_down_one_probe_is_let_through_per_process(
    clock: FakeClock, cache_down: Monotonic
) -> None:
    for _ in range(3):
        fail()
    assert breaker.store.degraded
    assert not breaker.allow(CONFIG)
    clock.advance(1.0)
    assert breaker.allow(CONFIG) and breaker.is_probe(CONFIG)
    assert not breaker.allow(CONFIG)  # the local slot is taken
    assert not breaker.allow(CONFIG)
    breaker.observe(CONFIG, result(True))
    assert phase(clock) == CLOSED
    assert breaker.allow(CONFIG) and not breaker.is_probe(CONFIG)


def test_with_the_cache_down_a_stuck_local_probe_slot_expires(
    clock: FakeClock, cache_down: Monotonic
) -> None:
    for _ in range(3):
        fail()
    clock.advance(1.0)
    assert breaker.allow(CONFIG)  # the probe's worker dies without reporting
    cache_down.now += 9.9
    assert not breaker.allow(CONFIG)
    cache_down.now += 0.1  # exactly the 10 s probe TTL: expired, not served as live
    assert breaker.allow(CONFIG)


def test_with_the_cache_down_health_is_read_from_local_state(
    clock: FakeClock, cache_down: Monotonic
) -> None:
    other = replace(CONFIG, name="secondary")
    for _ in range(3):
        fail()
    fail(other)
    circuits = breaker.store.load_many([("primary", "gpt-x"), ("secondary", "gpt-x")])
    assert circuits[("primary", "gpt-x")].phase(clock()) == OPEN
    assert circuits[("secondary", "gpt-x")].failures == 1
    assert circuits[("secondary", "gpt-x")].phase(clock()) == CLOSED
    assert len(circuits) == 2


def test_with_the_cache_down_an_operator_reset_closes_the_local_circuit(
    clock: FakeClock, cache_down: Monotonic
) -> None:
    for _ in range(3):
        fail()
    clock.advance(1.0)
    assert breaker.allow(CONFIG)  # a probe slot is held too
    breaker.store.reset("primary", "gpt-x")
    assert breaker.store.load("primary", "gpt-x").last_error_at is None
    assert breaker.allow(CONFIG) and not breaker.is_probe(CONFIG)  # closed, no probe


def test_with_the_cache_down_local_records_expire_after_a_day(
    clock: FakeClock, cache_down: Monotonic
) -> None:
    fail()
    assert breaker.store.load("primary", "gpt-x").failures == 1
    cache_down.now += breaker.RECORD_TTL_S - 1
    assert breaker.store.load("primary", "gpt-x").failures == 1
    cache_down.now += 1
    assert breaker.store.load("primary", "gpt-x").last_error_at is None


# --- router: recorded attempts ------------------------------------------------------------


@pytest.fixture
def two(scripted: type[ScriptedProvider], key_env: str) -> type[ScriptedProvider]:
    a = make_provider("a", supports_streaming=True, max_retries=2)
    b = make_provider("b", supports_streaming=True, supports_prefill=True)
    make_chain("main", [a, b], is_default=True)
    return scripted


@pytest.mark.django_db
def test_a_served_attempt_is_recorded_as_not_transient(two: type[ScriptedProvider]) -> None:
    routed = route(REQUEST, sleeper=Sleeps())
    assert routed.result.provider == "a"
    assert routed.metadata.attempts[0].transient is False
    row = Attempt.objects.get()
    assert (row.outcome, row.served, row.transient, row.reason) == ("ok", True, False, "")


@pytest.mark.django_db
def test_a_request_naming_a_chain_walks_that_chain(two: type[ScriptedProvider]) -> None:
    c = make_provider("c")
    make_chain("alt", [c])
    request = replace(REQUEST, chain="alt")
    plan = resolve(request)
    assert plan.names == ("c", "mock") and plan.chain_name == "alt"
    routed = route(request, sleeper=Sleeps())
    assert routed.result.provider == "c"
    assert routed.metadata.chain_name == "alt"
    assert routed.metadata.router_mode == "chain"  # a chain named directly is its own mode
    assert RoutingDecision.objects.get().chain_name == "alt"


@pytest.mark.django_db
@pytest.mark.parametrize(("forced", "reason"), [("off", "disabled"), ("ghost", "unknown_provider")])
def test_a_forced_provider_that_cannot_run_is_recorded_with_its_reason(
    two: type[ScriptedProvider], forced: str, reason: str
) -> None:
    make_provider("off", enabled=False)
    routed = route(replace(REQUEST, force_provider=forced), sleeper=Sleeps())
    assert routed.result.status in {"fallback", "error"}
    assert routed.metadata.attempts[0].reason == reason
    row = Attempt.objects.get()
    assert (row.provider, row.outcome, row.reason) == (forced, "skipped", reason)


@pytest.mark.django_db
def test_retry_after_zero_retries_at_once(two: type[ScriptedProvider]) -> None:
    two.scripts["a"] = [RateLimitError(http_status=429, retry_after=0), "ok"]
    sleeps = Sleeps()
    routed = route(REQUEST, sleeper=sleeps)
    assert routed.result.provider == "a" and routed.result.ok
    assert sleeps == [0.0]
    assert Attempt.objects.get().retries == 1


@pytest.mark.django_db
@override_settings(LLM_ROUTING={"MAX_ATTEMPTS": 0})
def test_a_forced_call_with_no_budget_left_records_no_retries(
    two: type[ScriptedProvider],
) -> None:
    routed = route(replace(REQUEST, force_provider="a"), sleeper=Sleeps())
    assert two.calls == []  # nothing was sent
    assert routed.result.error is not None and routed.result.error.category == "budget_exhausted"
    assert (routed.result.retries, routed.result.upstream_requests) == (0, 0)
    assert 0.0 <= routed.result.latency_ms < 1000.0
    row = Attempt.objects.get()
    assert (row.outcome, row.retries) == (
        "skipped",
        0,
    )  # forced calls draw on the budget: a recorded skip
    assert 0.0 <= row.latency_ms < 1000.0


def test_an_exhausted_budget_result_reports_zero_retries_and_its_own_latency() -> None:
    adapter = ScriptedProvider(
        ProviderConfig(name="a", kind="scripted", model="m", api_key_env="", max_retries=3)
    )
    spent = Budget(deadline_s=60.0, max_attempts=1)
    spent.take()
    before = time.perf_counter()
    out = call_with_retries(adapter, REQUEST, budget=spent, sleeper=Sleeps())
    elapsed_ms = (time.perf_counter() - before) * 1000
    assert out.error is not None and out.error.category == "timeout"
    assert (out.retries, out.upstream_requests) == (0, 0)
    assert isinstance(out.latency_ms, float) and 0.0 <= out.latency_ms <= elapsed_ms


def test_the_mock_ignores_a_spent_budget_and_reports_no_retries() -> None:
    spent = Budget(deadline_s=60.0, max_attempts=0)
    out = call_with_retries(
        MockProvider(ProviderConfig(name="mock", kind="mock", model="m", mode="mock")),
        REQUEST,
        budget=spent,
    )
    assert out.ok and (out.retries, out.upstream_requests) == (0, 0)


# --- router: the stream's end event -------------------------------------------------------


def stream(request: AuditRequest, mode: str | None = None) -> tuple[str, Any]:
    events = list(route_stream(request, stream_mode=mode, sleeper=Sleeps()))
    assert all(isinstance(e, StreamChunk) for e in events[:-1])
    text = "".join(e.text for e in events if isinstance(e, StreamChunk))
    return text, events[-1]


@pytest.mark.django_db
def test_an_adapter_bug_mid_stream_ends_in_a_failure_not_a_clean_result(
    two: type[ScriptedProvider],
) -> None:
    two.streams["a"] = [["one ", "two ", RuntimeError("adapter bug")]]
    text, last = stream(replace(REQUEST, stream=True))
    assert text == "one two "
    assert isinstance(last, StreamFailure)
    assert last.partial is True
    assert last.error.category == "response" and "RuntimeError" in last.error.message
    decision = RoutingDecision.objects.get()
    assert decision.status == "error"
    row = decision.attempts.get()
    assert (row.outcome, row.partial, row.served, row.error_category) == (
        "error",
        True,
        False,
        "response",
    )


@pytest.mark.django_db
def test_a_continuation_that_fails_mid_stream_reports_the_original_failure(
    two: type[ScriptedProvider],
) -> None:
    two.streams["a"] = [["The quick ", NetworkError("reset")]]
    two.streams["b"] = [["brown ", UnavailableError("gone", http_status=503)]]
    text, last = stream(replace(REQUEST, stream=True), "continuation")
    assert text == "The quick brown "
    assert isinstance(last, StreamFailure) and last.partial is True
    assert last.error.category == "network"  # a's failure, never b's
    assert last.routed.result.error is not None
    assert last.routed.result.error.category == "network"
    rows = list(
        RoutingDecision.objects.get().attempts.values_list(
            "provider", "outcome", "partial", "error_category"
        )
    )
    assert rows == [("a", "error", True, "network"), ("b", "error", True, "unavailable")]


@pytest.mark.django_db
def test_a_continuation_refused_before_its_first_chunk_reports_the_original(
    two: type[ScriptedProvider],
) -> None:
    two.streams["a"] = [["The quick ", NetworkError("reset")]]
    two.streams["b"] = [[InvalidRequestError("no prefill", http_status=400)]]
    text, last = stream(replace(REQUEST, stream=True), "continuation")
    assert text == "The quick "
    assert isinstance(last, StreamFailure) and last.error.category == "network"
    assert last.routed.result.error is not None
    assert last.routed.result.error.category == "network"
    assert isinstance(last, StreamFailure) and not isinstance(last, StreamResult)


# --- breaker: what operators read ---------------------------------------------------------


def test_the_health_view_of_an_open_circuit_in_utc(clock: FakeClock) -> None:
    clock.now = 1_900_000_000.0  # 2030-03-17T17:46:40Z
    for _ in range(3):
        fail()
    assert health(clock) == {
        "state": OPEN,
        "consecutive_failures": 3,
        "cooldown_step": 1,
        "open_until": "2030-03-17T17:46:41.000+00:00",
        "last_success_at": None,
        "last_error_at": "2030-03-17T17:46:40.000+00:00",
        "last_error_category": "unavailable",
        "last_http_status": 503,
    }


@pytest.mark.django_db
def test_circuits_per_provider_list_the_row_model_then_overrides_by_name(
    clock: FakeClock,
) -> None:
    from llm_routing.models import Chain, ChainEntry

    row = make_provider("p1", kind="openai", model="base")
    for position, model in enumerate(["z-model", "a-model", "m-model"]):
        chain = Chain.objects.create(name=f"c{position}")
        ChainEntry.objects.create(chain=chain, provider=row, position=0, model=model)
    circuits = breaker.store.for_providers([row])["p1"]
    assert [c.model for c in circuits] == ["base", "a-model", "m-model", "z-model"]


def test_an_operator_reset_also_frees_a_held_probe_slot(clock: FakeClock) -> None:
    for _ in range(3):
        fail()
    clock.advance(1.0)
    assert breaker.allow(CONFIG)  # a probe is out when the operator resets
    breaker.store.reset("primary", "gpt-x")
    for _ in range(3):
        fail()
    clock.advance(1.0)
    assert breaker.allow(CONFIG)  # the new half-open period has its own probe
    assert breaker.is_probe(CONFIG)


def test_an_operator_reset_is_logged_with_the_circuit(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_routing.breaker")
    breaker.store.reset("primary", "gpt-x")
    assert [r.getMessage() for r in caplog.records] == [
        "Circuit primary/gpt-x reset by an operator."
    ]


def test_with_the_cache_down_a_reset_of_a_clean_circuit_works(
    clock: FakeClock, cache_down: Monotonic
) -> None:
    breaker.store.reset("primary", "gpt-x")  # nothing stored locally: still no error
    assert breaker.allow(CONFIG)


def test_a_dead_cache_is_tried_once_per_retry_interval_and_logged_once(
    clock: FakeClock,
    cache_down: Monotonic,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tries: list[float] = []
    check = BrokenCache._check

    def counted(self: BrokenCache) -> None:
        tries.append(cache_down.now)
        check(self)

    monkeypatch.setattr(BrokenCache, "_check", counted)
    caplog.set_level(logging.WARNING, logger="llm_routing.breaker")
    for _ in range(5):
        assert breaker.allow(CONFIG)
    assert len(tries) == 1
    cache_down.now += breaker.CACHE_RETRY_S - 0.1
    assert breaker.allow(CONFIG)
    assert len(tries) == 1
    cache_down.now += 0.1
    assert breaker.allow(CONFIG)
    assert len(tries) == 2
    assert [r.getMessage() for r in caplog.records] == [
        "Circuit cache 'broken' failed (ConnectionError); using process-local circuit "
        "state until it answers again."
    ]


# --- router: what a finished stream reports -------------------------------------------------


@pytest.mark.django_db
def test_a_clean_stream_reports_its_finish_reason_model_and_usage(
    two: type[ScriptedProvider],
) -> None:
    two.streams["a"] = [["Hel", "lo", "END"]]
    _text, last = stream(replace(REQUEST, stream=True))
    assert isinstance(last, StreamResult)
    result = last.routed.result
    assert (result.output, result.finish_reason, result.model) == ("Hello", "stop", "a-model")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (2, 3)
    assert last.routed.metadata.fallback_used is False


@pytest.mark.django_db
def test_a_continued_stream_is_a_fallback_for_continuation(two: type[ScriptedProvider]) -> None:
    two.streams["a"] = [["The quick ", NetworkError("reset")]]
    two.streams["b"] = [["fox.", "END"]]
    _text, last = stream(replace(REQUEST, stream=True), "continuation")
    assert isinstance(last, StreamResult)
    meta = last.routed.metadata
    assert (meta.fallback_used, meta.fallback_reason) == (True, "continuation")
    assert (last.routed.result.provider, last.routed.result.model) == ("b", "b-model")
    decision = RoutingDecision.objects.get()
    assert (decision.fallback_reason, decision.selected_provider) == ("continuation", "b")


@pytest.mark.django_db
def test_a_continuation_goes_to_a_later_usable_prefill_candidate(
    scripted: type[ScriptedProvider], key_env: str
) -> None:
    early = make_provider("early", supports_streaming=True, supports_prefill=True)
    a = make_provider("a", supports_streaming=True, max_retries=0)
    off = make_provider("off", supports_streaming=True, supports_prefill=True, enabled=False)
    plain = make_provider("plain", supports_streaming=True)
    c = make_provider("c", supports_streaming=True, supports_prefill=True)
    make_chain("main", [early, a, off, plain, c], is_default=True)
    scripted.streams["early"] = [[UnavailableError(http_status=503)]]
    scripted.streams["a"] = [["Once ", NetworkError("reset")]]
    scripted.streams["c"] = [["upon a time.", "END"]]
    text, last = stream(replace(REQUEST, stream=True), "continuation")
    assert text == "Once upon a time."
    assert isinstance(last, StreamResult) and last.routed.result.provider == "c"
    # the failed "early" is before the cut and never continues; "off" is disabled,
    # "plain" declares no prefill support
    assert [p for p in scripted.prefills if p[1]] == [("c", "Once ")]


@pytest.mark.django_db
def test_a_mid_stream_failure_shows_in_the_providers_health(
    two: type[ScriptedProvider], clock: FakeClock
) -> None:
    two.streams["a"] = [["one ", NetworkError("reset")]]
    _text, last = stream(replace(REQUEST, stream=True))
    assert isinstance(last, StreamFailure)
    view = breaker.store.load("a", "a-model").health(clock())
    assert (view["last_error_category"], view["consecutive_failures"]) == ("network", 1)


# --- breaker: the state machine's edges -----------------------------------------------------

POLICY = Policy()
T0 = 1_900_000_000.0


def test_a_failed_probe_restarts_the_quiet_window(clock: FakeClock) -> None:
    for _ in range(3):
        fail()  # opened at T0 for 1 s
    clock.advance(59.0)
    fail()  # the probe fails at T0 + 59: open again, next ladder step (2 s)
    clock.advance(2.0)
    assert breaker.allow(CONFIG)
    breaker.observe(CONFIG, result(True))  # T0 + 61: only 2 s after the last failure
    assert health(clock)["cooldown_step"] == 2  # not quiet yet: the ladder is kept
    for _ in range(3):
        fail()
    clock.advance(4.9)
    assert phase(clock) == OPEN  # the third step: 5 s
    clock.advance(0.1)
    assert phase(clock) == HALF_OPEN


def test_a_late_short_429_does_not_extend_an_open_circuit(clock: FakeClock) -> None:
    for _ in range(3):
        fail()
    short_429 = RateLimitError(http_status=429, retry_after=3.0).to_info()
    breaker.observe(CONFIG, result(False, short_429))  # a call that began before it opened
    assert health(clock)["open_until"] == breaker._iso(clock() + 1.0)
    clock.advance(1.0)
    assert phase(clock) == HALF_OPEN


def test_a_failure_reported_without_probe_flag_is_not_the_probe() -> None:
    c = breaker.Circuit("p", "m")
    for _ in range(3):
        c = breaker.on_failure(c, T0, POLICY, UNAVAILABLE)
    assert c.phase(T0 + 1.0) == HALF_OPEN
    stray = breaker.on_failure(c, T0 + 1.0, POLICY, UNAVAILABLE)  # probe defaults to False
    assert stray.phase(T0 + 1.0) == HALF_OPEN and stray.level == 1


def test_a_late_probes_client_error_leaves_a_closed_circuits_count_alone() -> None:
    c = breaker.Circuit("p", "m")
    c = breaker.on_failure(c, T0, POLICY, UNAVAILABLE)
    c = breaker.on_failure(c, T0, POLICY, UNAVAILABLE)
    after = breaker.on_failure(c, T0 + 1.0, POLICY, BAD_REQUEST, probe=True)
    assert after.failures == 2 and after.last_http_status == 400


def test_a_fresh_store_is_not_degraded(clock: FakeClock) -> None:
    assert breaker.store.degraded is False


def test_a_late_long_429_never_shortens_an_open_period(clock: FakeClock) -> None:
    long_429 = RateLimitError(http_status=429, retry_after=100.0).to_info()
    fail(error=long_429)  # open for 100 s at once
    shorter = RateLimitError(http_status=429, retry_after=10.0).to_info()
    breaker.observe(CONFIG, result(False, shorter))  # a call that began before it opened
    clock.advance(99.9)
    assert phase(clock) == OPEN
    clock.advance(0.1)
    assert phase(clock) == HALF_OPEN


def test_the_operator_log_of_a_circuits_life(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llm_routing.breaker")
    for _ in range(3):
        fail()
    clock.advance(1.0)
    fail()  # the probe fails
    clock.advance(2.0)
    assert breaker.allow(CONFIG)
    breaker.observe(CONFIG, result(True))
    assert [r.getMessage() for r in caplog.records] == [
        "Circuit primary/gpt-x opened for 1.0s after unavailable (step 1).",
        "Circuit primary/gpt-x half-open: this call is the probe.",
        "Circuit primary/gpt-x opened for 2.0s after unavailable (step 2).",
        "Circuit primary/gpt-x half-open: this call is the probe.",
        "Circuit primary/gpt-x closed: the provider answered.",
    ]


def test_an_unreadable_record_reads_as_a_fresh_circuit_of_that_provider(
    clock: FakeClock,
) -> None:
    from django.core.cache import caches

    caches["default"].set(breaker._key("primary", "gpt-x"), {"state": "open", "failures": "x"})
    circuit = breaker.store.load("primary", "gpt-x")
    assert circuit == breaker.Circuit("primary", "gpt-x")
    caches["default"].set(breaker._key("primary", "gpt-x"), {"state": "closed", "bogus": 1})
    assert breaker.store.load("primary", "gpt-x") == breaker.Circuit("primary", "gpt-x")


def test_a_failed_result_without_error_details_counts_as_a_response_error(
    clock: FakeClock,
) -> None:
    bare = ProviderResult(
        provider="primary", model="gpt-x", mode="error", status="error", upstream_requests=1
    )
    breaker.observe(CONFIG, bare)
    assert health(clock)["last_error_category"] == "response"


def test_a_recovered_cache_clears_the_degraded_flag(
    clock: FakeClock,
    cache_down: Monotonic,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert breaker.allow(CONFIG)
    assert breaker.store.degraded is True
    monkeypatch.setattr(BrokenCache, "broken", False)
    cache_down.now += breaker.CACHE_RETRY_S
    caplog.set_level(logging.WARNING, logger="llm_routing.breaker")
    caplog.clear()
    assert breaker.allow(CONFIG)
    assert breaker.store.degraded is False
    assert [r.getMessage() for r in caplog.records] == [
        "Circuit cache is reachable again; using shared state."
    ]


def test_a_late_failure_while_open_logs_no_new_opening(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(3):
        fail()
    caplog.set_level(logging.INFO, logger="llm_routing.breaker")
    caplog.clear()
    breaker.observe(CONFIG, result(False))  # a call that began before it opened
    assert caplog.records == []
    assert health(clock)["consecutive_failures"] == 4


def test_invalid_breaker_settings_name_the_problem() -> None:
    with (
        override_settings(LLM_ROUTING={"BREAKER_COOLDOWNS_S": ["soon"]}),
        pytest.raises(ImproperlyConfigured) as bad_type,
    ):
        Policy.from_settings()
    assert str(bad_type.value).startswith("LLM_ROUTING breaker settings are invalid: ")
    assert "soon" in str(bad_type.value)
    with (
        override_settings(LLM_ROUTING={"BREAKER_COOLDOWN_MAX_S": 0}),
        pytest.raises(ImproperlyConfigured) as out_of_range,
    ):
        Policy.from_settings()
    assert str(out_of_range.value) == (
        "LLM_ROUTING: BREAKER_FAILURE_THRESHOLD must be >= 1 and BREAKER_COOLDOWNS_S "
        "a non-empty list of positive seconds (BREAKER_COOLDOWN_MAX_S positive)."
    )


# --- router: stream details a client sees ---------------------------------------------------


@pytest.mark.django_db
def test_stream_chunks_name_the_serving_provider_and_model(
    two: type[ScriptedProvider], key_env: str
) -> None:
    two.streams["a"] = [["Hel", "lo", "END"]]
    events = list(route_stream(replace(REQUEST, stream=True), request_id="rid-17"))
    chunks = [e for e in events if isinstance(e, StreamChunk)]
    assert [(c.text, c.provider, c.model) for c in chunks] == [
        ("Hel", "a", "a-model"),
        ("lo", "a", "a-model"),
    ]
    last = events[-1]
    assert isinstance(last, StreamResult) and last.routed.request_id == "rid-17"
    assert two.calls == [("a", key_env)]  # the key read at call time reaches the stream


@pytest.mark.django_db
def test_a_stream_retry_before_the_first_chunk_uses_the_given_sleeper(
    two: type[ScriptedProvider],
) -> None:
    two.streams["a"] = [[UnavailableError(http_status=503)], ["ok", "END"]]
    sleeps = Sleeps()
    events = list(route_stream(replace(REQUEST, stream=True), sleeper=sleeps))
    assert isinstance(events[-1], StreamResult) and events[-1].routed.result.provider == "a"
    assert len(sleeps) == 1


@pytest.mark.django_db
def test_an_empty_stream_fails_over_before_the_commit_point(
    two: type[ScriptedProvider],
) -> None:
    two.streams["a"] = [[]]  # the body ends before any event
    two.streams["b"] = [["from b", "END"]]
    text, last = stream(replace(REQUEST, stream=True))
    assert text == "from b"
    assert isinstance(last, StreamResult) and last.routed.result.provider == "b"


@pytest.mark.django_db
def test_a_forced_empty_stream_reports_why(two: type[ScriptedProvider]) -> None:
    two.streams["a"] = [[]]
    _text, last = stream(replace(REQUEST, stream=True, force_provider="a"))
    assert isinstance(last, StreamResult)
    assert last.routed.result.error is not None
    assert last.routed.result.error.message == "The stream ended before it finished."


@pytest.mark.django_db
def test_a_stream_cut_without_an_end_says_so(
    two: type[ScriptedProvider], caplog: pytest.LogCaptureFixture
) -> None:
    two.streams["a"] = [["half"]]
    _text, last = stream(replace(REQUEST, stream=True))
    assert isinstance(last, StreamFailure)
    assert last.error.message == "The stream was cut before it finished."
    two.streams["a"] = [["half", KeyError("bug")]]
    caplog.set_level(logging.ERROR, logger="llm_routing.router")
    _text, last = stream(replace(REQUEST, stream=True))
    assert isinstance(last, StreamFailure)
    assert last.error.message == "The stream failed (KeyError)."
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["Stream adapter raised KeyError"]


@pytest.mark.django_db
def test_a_stream_error_result_keeps_its_fallback_reason_and_is_recorded(
    two: type[ScriptedProvider],
) -> None:
    from llm_routing.errors import ContentPolicyError

    two.streams["a"] = [[UnavailableError(http_status=503)]]
    two.streams["b"] = [[ContentPolicyError("no", http_status=400)]]
    _text, last = stream(replace(REQUEST, stream=True))
    assert isinstance(last, StreamResult) and last.routed.result.status == "error"
    assert last.routed.metadata.fallback_reason == "unavailable"
    assert RoutingDecision.objects.get().fallback_reason == "unavailable"


@pytest.mark.django_db
def test_forcing_the_mock_streams_the_mock(two: type[ScriptedProvider]) -> None:
    text, last = stream(replace(REQUEST, stream=True, force_provider="mock"))
    assert isinstance(last, StreamResult) and last.routed.result.provider == "mock"
    assert text.startswith("[mock]")


@pytest.mark.django_db
def test_a_forced_attempt_records_the_providers_own_model(two: type[ScriptedProvider]) -> None:
    routed = route(replace(REQUEST, force_provider="a"), sleeper=Sleeps())
    assert routed.result.model == "a-model"
    assert Attempt.objects.get().model == "a-model"


@pytest.mark.django_db
def test_a_mid_stream_failure_is_recorded_with_its_details(two: type[ScriptedProvider]) -> None:
    two.streams["a"] = [["one ", UnavailableError("gone", http_status=503)]]
    _text, last = stream(replace(REQUEST, stream=True))
    assert isinstance(last, StreamFailure)
    result = last.routed.result
    assert (result.mode, result.status, result.output) == ("error", "error", "one ")
    row = Attempt.objects.get()
    assert (row.reason, row.error_category, row.http_status, row.transient) == (
        "unavailable",
        "unavailable",
        503,
        True,
    )


@pytest.mark.django_db
def test_a_continued_streams_cut_attempt_is_recorded_with_its_details(
    two: type[ScriptedProvider],
) -> None:
    two.streams["a"] = [["one ", UnavailableError("gone", http_status=503)]]
    two.streams["b"] = [["two", "END"]]
    text, last = stream(replace(REQUEST, stream=True), "continuation")
    assert text == "one two" and isinstance(last, StreamResult)
    rows = list(
        Attempt.objects.values_list(
            "provider", "reason", "error_category", "http_status", "transient", "partial"
        )
    )
    assert rows == [
        ("a", "unavailable", "unavailable", 503, True, True),
        ("b", "", "", None, False, False),
    ]


@pytest.mark.django_db
def test_every_fallback_is_announced_with_request_provider_and_reason(
    scripted: type[ScriptedProvider], key_env: str
) -> None:
    from llm_routing.signals import on_provider_fallback

    rows = [make_provider("off", enabled=False), make_provider("a"), make_provider("b")]
    make_chain("main", rows, is_default=True)
    scripted.scripts["a"] = [UnavailableError(http_status=503)]
    heard: list[tuple[Any, ...]] = []

    def receiver(sender: Any, **kw: Any) -> None:
        heard.append((kw["request_id"], kw["provider"], kw["reason"]))

    on_provider_fallback.connect(receiver)
    try:
        routed = route(REQUEST, request_id="rid-f", sleeper=Sleeps())
    finally:
        on_provider_fallback.disconnect(receiver)
    assert routed.result.provider == "b"
    assert heard == [("rid-f", "off", "disabled"), ("rid-f", "a", "unavailable")]


@pytest.mark.django_db
@pytest.mark.parametrize(("skip_first", "reason"), [(False, None), (True, "disabled")])
def test_a_permanent_error_is_a_fallback_only_after_an_earlier_candidate(
    scripted: type[ScriptedProvider], key_env: str, skip_first: bool, reason: str | None
) -> None:
    from llm_routing.errors import ContentPolicyError

    rows = [make_provider("a"), make_provider("b")]
    if skip_first:
        rows.insert(0, make_provider("off", enabled=False))
    make_chain("main", rows, is_default=True)
    scripted.scripts["a"] = [ContentPolicyError("no", http_status=400)]
    routed = route(REQUEST, sleeper=Sleeps())
    assert routed.result.status == "error" and routed.result.provider == "a"
    assert routed.metadata.fallback_reason == reason
    assert routed.metadata.fallback_used is (reason is not None)


# --- breaker.peek: what allow() would answer, read-only -------------------------------------


def test_peek_reads_every_phase_without_claiming_the_probe(clock: FakeClock) -> None:
    look = breaker.peek(CONFIG)
    assert (look.tracked, look.phase, look.allowed, look.probe) == (True, CLOSED, True, False)
    assert look.circuit == breaker.store.load("primary", "gpt-x")
    for _ in range(3):
        fail()
    look = breaker.peek(CONFIG)
    assert (look.tracked, look.phase, look.allowed, look.probe) == (True, OPEN, False, False)
    assert look.circuit is not None and look.circuit.failures == 3
    clock.advance(1.0)
    look = breaker.peek(CONFIG)
    assert (look.tracked, look.phase, look.allowed, look.probe) == (True, HALF_OPEN, True, True)
    assert look.circuit is not None and look.circuit.open_until == clock()
    assert breaker.peek(CONFIG).probe  # peeking claimed nothing
    assert breaker.allow(CONFIG)  # this call claims the probe slot
    look = breaker.peek(CONFIG)
    assert (look.phase, look.allowed, look.probe) == (HALF_OPEN, False, False)
    assert look.circuit is not None and look.circuit.failures == 3


def test_peek_of_the_mock_tracks_nothing(clock: FakeClock) -> None:
    mock = ProviderConfig(name="mock", kind="mock", model="mock-1", mode="mock")
    look = breaker.peek(mock)
    assert (look.tracked, look.phase, look.allowed, look.probe, look.circuit) == (
        False,
        CLOSED,
        True,
        False,
        None,
    )


def test_peek_is_per_provider_and_model(clock: FakeClock) -> None:
    for _ in range(3):
        fail()
    other = replace(CONFIG, name="secondary")
    assert breaker.peek(other).phase == CLOSED
    assert breaker.peek(replace(CONFIG, model="gpt-y")).phase == CLOSED


def test_an_operator_forcing_a_circuit_open_is_logged_and_timed(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_routing.breaker")
    after = breaker.store.force_open("primary", "gpt-x", 30.0)
    assert (after.state, after.opened_at, after.open_until) == (OPEN, clock(), clock() + 30.0)
    assert breaker.store.load("primary", "gpt-x").opened_at == clock()
    assert [r.getMessage() for r in caplog.records] == [
        "Circuit primary/gpt-x forced open for 30s by an operator."
    ]
