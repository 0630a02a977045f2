"""The breaker's pure state machine on a fake clock, and its store over the Django cache."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import shutil
from collections.abc import Generator
from dataclasses import replace
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from llm_routing import effects
from llm_routing.effects import Context, Effect
from llm_routing.errors import AuthenticationError, RateLimitError
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    Allow,
    CacheOp,
    Circuit,
    CircuitStore,
    PeekCircuit,
    Policy,
    on_failure,
    on_success,
)
from llm_routing.types import ErrorInfo, ProviderConfig, ProviderResult

from .breaker_support import BrokenCache, FakeClock, GatedCache

POLICY = Policy(
    threshold=3,
    cooldowns=(1.0, 2.0, 5.0, 10.0),
    cooldown_max=10.0,
    reset_after=60.0,
    retry_after_cap=5.0,
    retry_after_max=300.0,
    probe_ttl=10.0,
)
UNAVAILABLE = ErrorInfo(category="unavailable", message="503", http_status=503, transient=True)
TIMEOUT = ErrorInfo(category="timeout", message="slow", transient=True)
T0 = 1_900_000_000.0


def fresh() -> Circuit:
    return Circuit(provider="p", model="m")


def fail(c: Circuit, now: float, error: ErrorInfo = UNAVAILABLE, *, probe: bool = False) -> Circuit:
    return on_failure(c, now, POLICY, error, probe=probe)


def opened(now: float = T0) -> Circuit:
    c = fresh()
    for _ in range(POLICY.threshold):
        c = fail(c, now)
    return c


# --- pure state machine ------------------------------------------------------------------


def test_closed_below_threshold_and_success_resets_the_count() -> None:
    c = fail(fail(fresh(), T0), T0 + 1)
    assert c.phase(T0 + 1) == CLOSED and c.failures == 2
    c = on_success(c, T0 + 2, POLICY)
    assert c.failures == 0 and c.last_success_at == T0 + 2
    c = fail(fail(c, T0 + 3), T0 + 4)
    assert c.phase(T0 + 4) == CLOSED


def test_threshold_consecutive_transient_failures_open_the_circuit() -> None:
    c = fail(fail(fail(fresh(), T0, TIMEOUT), T0), T0)
    assert c.state == OPEN
    assert c.phase(T0) == OPEN
    assert c.open_until == T0 + 1.0
    assert c.level == 1
    assert c.last_error_category == "unavailable" and c.last_http_status == 503


def test_open_becomes_half_open_when_the_cooldown_has_passed() -> None:
    c = opened()
    assert c.phase(T0 + 0.999) == OPEN
    assert c.phase(T0 + 1.0) == HALF_OPEN


def test_probe_success_closes() -> None:
    c = on_success(opened(), T0 + 1.5, POLICY)
    assert c.phase(T0 + 1.5) == CLOSED
    assert c.failures == 0 and c.open_until is None


def test_probe_failure_reopens_with_the_next_ladder_step_up_to_the_cap() -> None:
    c = opened()
    now = T0
    seen = []
    for _ in range(6):
        now = c.open_until or now
        assert c.phase(now) == HALF_OPEN
        c = fail(c, now, probe=True)
        assert c.phase(now) == OPEN
        seen.append((c.open_until or 0) - now)
    assert seen == [2.0, 5.0, 10.0, 10.0, 10.0, 10.0]


def test_cooldown_max_caps_every_step() -> None:
    policy = replace(POLICY, cooldowns=(4.0, 30.0), cooldown_max=7.0)
    assert [policy.cooldown(i) for i in range(4)] == [4.0, 7.0, 7.0, 7.0]


def test_flapping_climbs_the_ladder_and_a_quiet_window_resets_it() -> None:
    c = on_success(opened(), T0 + 1, POLICY)  # closed again, step kept
    assert c.level == 1
    now = T0 + 10
    for _ in range(3):
        c = fail(c, now)
    assert c.open_until == now + 2.0  # the second step: still in the same streak
    c = on_success(c, now + 2, POLICY)
    later = now + 2 + POLICY.reset_after  # a quiet minute without counted failures
    for _ in range(3):
        c = fail(c, later)
    assert c.open_until == later + 1.0  # back to the first step
    assert c.level == 1


def test_old_failures_do_not_add_up_after_the_quiet_window() -> None:
    c = fail(fail(fresh(), T0), T0)
    c = fail(c, T0 + POLICY.reset_after)
    assert c.phase(T0 + POLICY.reset_after) == CLOSED
    assert c.failures == 1


def test_a_429_over_the_retry_cap_opens_at_once_for_at_least_retry_after() -> None:
    limited = ErrorInfo(
        category="rate_limit", message="slow down", http_status=429, transient=True,
        retry_after_s=42.0,
    )  # fmt: skip
    c = fail(fresh(), T0, limited)
    assert c.phase(T0) == OPEN
    assert c.open_until == T0 + 42.0
    assert c.phase(T0 + 41.9) == OPEN and c.phase(T0 + 42.0) == HALF_OPEN


def test_a_429_within_the_retry_cap_counts_like_any_transient_failure() -> None:
    short = ErrorInfo(category="rate_limit", message="", transient=True, retry_after_s=2.0)
    c = fail(fail(fresh(), T0, short), T0, short)
    assert c.phase(T0) == CLOSED
    assert fail(c, T0, short).open_until == T0 + 1.0


def test_an_absurd_retry_after_is_bounded_by_breaker_retry_after_max() -> None:
    huge = ErrorInfo(category="rate_limit", message="", transient=True, retry_after_s=86_400.0)
    assert fail(fresh(), T0, huge).open_until == T0 + 300.0


def test_a_long_429_while_open_extends_the_open_period() -> None:
    limited = ErrorInfo(category="rate_limit", message="", transient=True, retry_after_s=30.0)
    c = fail(opened(), T0 + 0.5, limited)
    assert c.open_until == T0 + 30.5


@pytest.mark.parametrize(
    "category",
    ["authentication", "invalid_request", "content_policy", "response", "context_length"],
)
def test_non_transient_failures_never_open_a_circuit(category: str) -> None:
    error = ErrorInfo(category=category, message="", http_status=400, transient=False)
    c = fresh()
    for i in range(50):
        c = fail(c, T0 + i, error)
    assert c.phase(T0 + 50) == CLOSED
    assert c.failures == 0
    assert c.last_error_category == category and c.last_http_status == 400


def test_context_length_never_counts_even_if_marked_transient() -> None:
    odd = ErrorInfo(category="context_length", message="", transient=True)
    c = fresh()
    for _ in range(10):
        c = fail(c, T0, odd)
    assert c.phase(T0) == CLOSED


def test_a_probe_answered_with_a_client_error_closes_the_circuit() -> None:
    auth = ErrorInfo(category="authentication", message="", http_status=401)
    c = fail(opened(), T0 + 1, auth, probe=True)
    assert c.phase(T0 + 1) == CLOSED


def test_a_stray_failure_in_half_open_is_not_the_probe_and_does_not_reopen() -> None:
    c = opened()
    after = fail(c, T0 + 1, probe=False)
    assert after.phase(T0 + 1) == HALF_OPEN
    assert after.open_until == c.open_until


def test_records_round_trip_and_garbage_reads_as_closed() -> None:
    c = opened()
    assert Circuit.from_record("p", "m", c.to_record()) == c
    assert Circuit.from_record("p", "m", {"state": "melted"}) == fresh()
    assert Circuit.from_record("p", "m", {"nonsense": 1}) == fresh()
    assert Circuit.from_record("p", "m", "not a dict") == fresh()
    assert Circuit.from_record("p", "m", {"state": "open", "open_until": "soon"}) == fresh()
    assert Circuit.from_record("p", "m", {"failures": "3"}) == fresh()
    assert Circuit.from_record("p", "m", {"state": "open", "open_until": None}) == fresh()


def test_health_view_of_a_circuit() -> None:
    h = opened().health(T0)
    assert h["state"] == OPEN
    assert h["consecutive_failures"] == 3
    assert h["open_until"].startswith("2030-03-17T17:46:41")
    assert h["last_error_category"] == "unavailable" and h["last_http_status"] == 503
    assert opened().health(T0 + 1)["state"] == HALF_OPEN


def test_default_settings_return_traffic_within_15_seconds() -> None:
    policy = Policy.from_settings()
    assert policy.cooldowns == (1.0, 2.0, 5.0, 10.0)
    # A healed provider waits at most one (capped) cooldown before the next probe.
    assert max(policy.cooldown(i) for i in range(20)) <= 10.0 < 15.0


@pytest.mark.parametrize(
    "overrides",
    [
        {"BREAKER_COOLDOWNS_S": []},
        {"BREAKER_COOLDOWNS_S": [1.0, -2.0]},
        {"BREAKER_COOLDOWNS_S": ["soon"]},
        {"BREAKER_FAILURE_THRESHOLD": 0},
    ],
)
def test_invalid_breaker_settings_are_a_clear_configuration_error(overrides: dict) -> None:
    with override_settings(LLM_ROUTING=overrides), pytest.raises(ImproperlyConfigured):
        Policy.from_settings()


@override_settings(LLM_ROUTING={"BREAKER_COOLDOWNS_S": [2.0, 0]})
def test_the_system_check_reports_an_invalid_ladder() -> None:
    from llm_routing.checks import check_settings

    messages = check_settings()
    assert [m.id for m in messages] == ["llm_routing.E002"]
    assert "BREAKER_COOLDOWNS_S" in messages[0].msg


def test_provider_errors_carry_retry_after_but_do_not_expose_it() -> None:
    info = RateLimitError(http_status=429, retry_after=12.5).to_info()
    assert info.retry_after_s == 12.5
    assert "retry_after_s" not in info.to_dict()
    assert AuthenticationError().to_info().retry_after_s is None


# --- the store over the Django cache ----------------------------------------------------

CONFIG = ProviderConfig(name="primary", kind="openai", model="gpt-x", timeout_s=5.0)


def result(ok: bool, error: ErrorInfo = UNAVAILABLE, upstream: int = 1) -> ProviderResult:
    return ProviderResult(
        provider=CONFIG.name,
        model=CONFIG.model,
        mode="live" if ok else "error",
        status="ok" if ok else "error",
        error=None if ok else error,
        upstream_requests=upstream,
    )


def trip() -> None:
    for _ in range(3):
        assert breaker.allow(CONFIG)
        breaker.observe(CONFIG, result(False))


def test_store_opens_and_skips_then_lets_exactly_one_probe_through(clock: FakeClock) -> None:
    trip()
    assert not breaker.allow(CONFIG)
    clock.advance(1.0)
    assert breaker.allow(CONFIG)  # this call holds the probe slot
    assert breaker.is_probe(CONFIG)
    assert not breaker.allow(CONFIG)  # everyone else skips while the probe is out
    assert not breaker.allow(CONFIG)
    breaker.observe(CONFIG, result(True))
    assert not breaker.is_probe(CONFIG)
    assert breaker.store.load("primary", "gpt-x").phase(clock()) == CLOSED
    assert breaker.allow(CONFIG) and not breaker.is_probe(CONFIG)


def test_failed_probe_releases_the_slot_and_reopens_longer(clock: FakeClock) -> None:
    trip()
    clock.advance(1.0)
    assert breaker.allow(CONFIG)
    breaker.observe(CONFIG, result(False))
    circuit = breaker.store.load("primary", "gpt-x")
    assert circuit.phase(clock()) == OPEN and circuit.open_until == clock() + 2.0
    clock.advance(2.0)
    assert breaker.allow(CONFIG)  # the slot was released: the next step has its probe


def test_a_result_without_any_upstream_request_is_not_counted(clock: FakeClock) -> None:
    for _ in range(5):
        breaker.observe(CONFIG, result(False, upstream=0))
    assert breaker.store.load("primary", "gpt-x") == Circuit("primary", "gpt-x")
    trip()
    clock.advance(1.0)
    assert breaker.allow(CONFIG)
    breaker.observe(CONFIG, result(False, upstream=0))  # budget ran out before the probe
    assert breaker.allow(CONFIG)  # slot released, state unchanged: still half-open


def test_circuits_are_keyed_by_provider_and_model(clock: FakeClock) -> None:
    trip()
    other_model = CONFIG.with_model("gpt-y")
    assert not breaker.allow(CONFIG)
    assert breaker.allow(other_model)
    assert breaker.allow(replace(CONFIG, name="secondary"))


def test_the_mock_has_no_circuit(clock: FakeClock) -> None:
    mock = ProviderConfig(name="mock", kind="mock", model="mock-1")
    staged = replace(CONFIG, mode="mock")
    for cfg in (mock, staged):
        for _ in range(5):
            breaker.observe(cfg, result(False))
        assert breaker.allow(cfg)
        assert breaker.store.load(cfg.name, cfg.model) == Circuit(cfg.name, cfg.model)


def test_reset_closes_and_forgets(clock: FakeClock) -> None:
    trip()
    breaker.store.reset("primary", "gpt-x")
    assert breaker.allow(CONFIG)
    assert breaker.store.load("primary", "gpt-x").last_error_at is None


def test_two_stores_on_one_cache_share_state(clock: FakeClock) -> None:
    trip()
    other_process = CircuitStore(clock=clock)
    assert not other_process.allow(CONFIG)
    clock.advance(1.0)
    assert other_process.allow(CONFIG)
    assert not breaker.allow(CONFIG)  # the other store holds the single probe slot


def _drive(ops: Generator[Effect[object], Any, bool], value: Any) -> bool:
    """Finish a decision of a store from ``value`` on (its cache calls, one at a time)."""
    while True:
        try:
            op = ops.send(value)
        except StopIteration as stop:
            return bool(stop.value)
        value = op.run(Context())


def test_a_half_open_read_made_stale_by_a_failed_probe_does_not_make_a_second_probe(
    clock: FakeClock,
) -> None:
    """Another worker reads the circuit half-open; before it claims the probe slot, the
    probe fails, re-opens the circuit and frees the slot. Its claim must not become a
    second probe in the same cooldown moment (measured with two gunicorn workers:
    docs/benchmarks-breaker.md)."""
    trip()
    clock.advance(1.0)
    other_worker = CircuitStore(clock=clock)
    late = other_worker._allow(CONFIG)  # its allow(), one cache call at a time
    op = next(late)
    assert isinstance(op, CacheOp) and op.method == "get"
    half_open = op.run(Context())  # reads the circuit half-open

    def probe_fails() -> None:
        assert breaker.allow(CONFIG) and breaker.is_probe(CONFIG)
        breaker.observe(CONFIG, result(False))

    contextvars.copy_context().run(probe_fails)
    assert breaker.store.load("primary", "gpt-x").phase(clock()) == OPEN  # for 2 s
    assert not _drive(late, half_open)  # skips: no probe while open
    assert not other_worker.is_probe(CONFIG)
    clock.advance(2.0)
    assert breaker.allow(CONFIG) and breaker.is_probe(CONFIG)  # the next step's probe


def test_a_late_failure_read_half_open_does_not_undo_the_probes_reopening(
    clock: FakeClock,
) -> None:
    """A call admitted before the circuit opened fails while it is half-open (another
    worker): it reads the record, the probe fails and re-opens the circuit, then the
    late call would write its (stale, expired) record back — half-open again, and the
    next caller probes at once. Its update is health only: it is not written."""
    trip()
    clock.advance(1.0)
    late_worker = CircuitStore(clock=clock)
    late = late_worker._observe_all(CONFIG, result(False))
    op = next(late)
    assert isinstance(op, CacheOp) and op.method == "get"
    expired = op.run(Context())  # the step-1 record, half-open

    def probe_fails() -> None:
        assert breaker.allow(CONFIG) and breaker.is_probe(CONFIG)
        breaker.observe(CONFIG, result(False))

    contextvars.copy_context().run(probe_fails)
    _drive(late, expired)
    circuit = breaker.store.load("primary", "gpt-x")
    assert circuit.phase(clock()) == OPEN and circuit.open_until == clock() + 2.0
    assert not breaker.allow(CONFIG)  # no second probe in this cooldown step


def test_a_half_open_read_made_stale_by_a_probe_success_is_a_plain_call(
    clock: FakeClock,
) -> None:
    trip()
    clock.advance(1.0)
    other_worker = CircuitStore(clock=clock)
    late = other_worker._allow(CONFIG)
    half_open = next(late).run(Context())

    def probe_succeeds() -> None:
        assert breaker.allow(CONFIG)
        breaker.observe(CONFIG, result(True))

    contextvars.copy_context().run(probe_succeeds)
    assert _drive(late, half_open)  # closed now: allowed, as no probe
    assert not other_worker.is_probe(CONFIG)
    assert breaker.allow(CONFIG) and not breaker.is_probe(CONFIG)  # no slot left held


@override_settings(
    CACHES={
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "broken": {"BACKEND": "tests.breaker_support.BrokenCache"},
    },
    LLM_ROUTING={"CACHE_ALIAS": "broken"},
)
def test_a_failing_cache_falls_back_to_local_state_and_logs_once(
    clock: FakeClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(BrokenCache, "broken", True)
    BrokenCache._data.clear()
    caplog.set_level(logging.INFO, logger="llm_routing.breaker")
    for _ in range(20):
        assert breaker.allow(CONFIG)  # never raises
        breaker.observe(CONFIG, result(True))
    trip()
    assert not breaker.allow(CONFIG)  # the local state still protects this process
    assert breaker.store.degraded
    warnings = [r for r in caplog.records if "Circuit cache" in r.getMessage()]
    assert len(warnings) == 1
    assert "ConnectionError" in warnings[0].getMessage()
    assert "s3cret" not in caplog.text  # the exception text (a URL) is not logged
    # The cache comes back: after the retry interval the store uses it again, once more
    # logging the change.
    monkeypatch.setattr(BrokenCache, "broken", False)
    breaker.store.backoff.retry_at = 0.0  # the retry interval has passed
    assert breaker.allow(CONFIG)  # the shared cache has no open circuit
    assert not breaker.store.degraded
    assert "reachable again" in caplog.text


def test_successes_on_a_clean_circuit_rewrite_health_at_most_once_a_second(
    clock: FakeClock,
) -> None:
    breaker.observe(CONFIG, result(True))
    first = clock()
    clock.advance(0.5)
    breaker.observe(CONFIG, result(True))
    assert breaker.store.load("primary", "gpt-x").last_success_at == first
    clock.advance(0.5)
    breaker.observe(CONFIG, result(True))
    assert breaker.store.load("primary", "gpt-x").last_success_at == clock()
    breaker.observe(CONFIG, result(False))
    clock.advance(0.1)
    breaker.observe(CONFIG, result(True))  # not clean any more: written at once
    circuit = breaker.store.load("primary", "gpt-x")
    assert circuit.last_success_at == clock() and circuit.failures == 0


def test_a_late_probe_does_not_free_a_slot_another_caller_holds(clock: FakeClock) -> None:
    from django.core.cache import caches

    trip()
    clock.advance(1.0)
    assert breaker.allow(CONFIG)
    slot = breaker._key("primary", "gpt-x") + ":probe"
    caches["default"].set(slot, "someone-else")  # our slot expired and was re-claimed
    breaker.observe(CONFIG, result(False))
    assert caches["default"].get(slot) == "someone-else"


@pytest.mark.parametrize(
    ("env", "backend", "location"),
    [
        ({"REDIS_URL": "redis://10.0.0.9:6379/3"}, "redis.RedisCache", "redis://10.0.0.9:6379/3"),
        (
            {"REDIS_URL": "redis://10.0.0.9:6379/3", "CACHE_URL": "locmemcache://x"},
            "locmem.LocMemCache",
            "x",
        ),
        ({}, "locmem.LocMemCache", "llm-routing"),
    ],
)
def test_demo_settings_pick_the_cache_from_cache_url_or_redis_url(
    env: dict[str, str], backend: str, location: str
) -> None:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    clean = {k: v for k, v in os.environ.items() if k not in {"CACHE_URL", "REDIS_URL"}}
    code = "import json, project.settings as s; print(json.dumps(s.CACHES['default']))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "DEBUG": "true", **env},
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cache = json.loads(out)
    assert cache["BACKEND"] == f"django.core.cache.backends.{backend}"
    assert cache["LOCATION"] == location
    if backend.startswith("redis"):
        assert cache["OPTIONS"] == {"socket_connect_timeout": 1.0, "socket_timeout": 1.0}


def _ops_of(store: CircuitStore, ops: Generator[Effect[object], Any, Any]) -> list[str]:
    """Run a decision of ``store``; the cache methods it called, in order."""
    called: list[str] = []
    value: Any = None
    while True:
        try:
            op = ops.send(value)
        except StopIteration:
            return called
        assert isinstance(op, CacheOp)
        called.append(op.method)
        value = op.run(Context())


def test_a_success_on_a_healthy_circuit_costs_one_cache_read(clock: FakeClock) -> None:
    """The hot path (docs/circuit-breakers.md): allow() reads the circuit once, and the
    success that follows on a clean, recently written circuit reuses that read and
    writes nothing. The remembered read serves that one call only."""
    store = breaker.store
    assert breaker.allow(CONFIG)
    breaker.observe(CONFIG, result(True))  # a recent success on record
    clock.advance(0.1)
    assert _ops_of(store, store._allow(CONFIG)) == ["get"]
    assert _ops_of(store, store._observe(CONFIG, result(True), probe=False)) == []
    # Spent: another success without an allow() of its own reads the circuit again.
    assert _ops_of(store, store._observe(CONFIG, result(True), probe=False)) == ["get"]
    # A failure never takes the shortcut: it reads, counts and writes.
    assert _ops_of(store, store._allow(CONFIG)) == ["get"]
    assert _ops_of(store, store._observe(CONFIG, result(False), probe=False)) == ["get", "set"]


# --- the async cache path and the breaker's effects ------------------------------------------
# Each branch of CacheOp.arun (awaited) against a real backend: LocMem (inline), any
# other Django backend (its async methods), Redis (redis.asyncio, a throwaway
# redis-server), a failing one (process-local state); and the Allow / PeekCircuit
# effects on both drivers.


async def _atrip() -> None:
    for _ in range(3):
        assert await breaker.aallow(CONFIG)
        await breaker.aobserve(CONFIG, result(False))


def _shared_by_the_async_path(clock: FakeClock) -> None:
    """Trip the circuit through the async path; another store (the sync path, as in
    another worker) sees it open, then sees the probe slot the async path claimed."""
    asyncio.run(_atrip())
    assert not breaker.store.degraded
    other_process = CircuitStore(clock=clock)
    circuit = other_process.load("primary", "gpt-x")
    assert circuit.phase(clock()) == OPEN and circuit.failures == 3
    assert not other_process.allow(CONFIG)
    clock.advance(1.0)
    assert asyncio.run(breaker.aallow(CONFIG))  # the probe slot, claimed asynchronously
    assert not other_process.allow(CONFIG)  # held in the shared cache
    assert not breaker.store.degraded


def test_the_async_path_keeps_circuits_in_the_shared_locmem_cache(clock: FakeClock) -> None:
    _shared_by_the_async_path(clock)


def test_the_async_path_uses_any_other_backends_async_methods(
    clock: FakeClock, tmp_path: Any
) -> None:
    files = {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache"}
    with override_settings(
        CACHES={
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "files": {**files, "LOCATION": str(tmp_path)},
        },
        LLM_ROUTING={"CACHE_ALIAS": "files"},
    ):
        _shared_by_the_async_path(clock)
        from django.core.cache import caches

        record = caches["files"].get(breaker._key("primary", "gpt-x"))
        assert record is not None and record["state"] == OPEN


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_the_async_path_talks_to_redis_through_redis_asyncio(clock: FakeClock) -> None:
    from .test_cache_outage import OwnRedis

    server = OwnRedis()  # a throwaway redis-server on a free port, never the shared one
    server.start()
    try:
        with override_settings(LLM_ROUTING={"REDIS_URL": server.url}):
            _shared_by_the_async_path(clock)
    finally:
        server.kill()


@override_settings(
    CACHES={
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "broken": {"BACKEND": "tests.breaker_support.BrokenCache"},
    },
    LLM_ROUTING={"CACHE_ALIAS": "broken"},
)
def test_the_async_path_falls_back_to_local_state_and_logs_the_error_type_once(
    clock: FakeClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(BrokenCache, "broken", True)
    BrokenCache._data.clear()
    caplog.set_level(logging.WARNING, logger="llm_routing.breaker")
    asyncio.run(_atrip())  # never raises
    assert asyncio.run(breaker.aallow(CONFIG)) is False  # the local state protects
    assert breaker.store.degraded
    warnings = [r for r in caplog.records if "Circuit cache" in r.getMessage()]
    assert len(warnings) == 1
    assert "(ConnectionError)" in warnings[0].getMessage()
    assert "s3cret" not in caplog.text


def _cancelled_at_read(clock: FakeClock, tmp_path: Any, reads_after: int, call: Any) -> None:
    """Half-open, this task claims the probe (``aallow``); then ``call`` (in this task's
    context) is cancelled at its ``reads_after``-th cache read from now."""
    gated = {"BACKEND": "tests.breaker_support.GatedCache", "LOCATION": str(tmp_path)}
    with override_settings(
        CACHES={
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "gated": gated,
        },
        LLM_ROUTING={"CACHE_ALIAS": "gated"},
    ):
        GatedCache.gate_at, GatedCache.reached = None, None
        trip()
        clock.advance(1.0)

        async def cancelled() -> None:
            GatedCache.reached = asyncio.Event()
            GatedCache.gate_at = GatedCache.reads + reads_after
            task = asyncio.create_task(call())
            await asyncio.wait_for(GatedCache.reached.wait(), 60)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancelled())
        GatedCache.gate_at = None
        # Another request: the circuit is still half-open and the slot is free again.
        assert contextvars.Context().run(breaker.allow, CONFIG)
        assert not breaker.store.degraded


def test_a_cancellation_in_the_middle_of_aobserve_frees_the_probe_slot(
    clock: FakeClock, tmp_path: Any
) -> None:
    """The probe's task is cancelled while ``aobserve`` reads the circuit: the async
    trampoline still runs the observation's cleanup, which gives the slot back (before,
    the slot stayed taken until its TTL and no probe was let through meanwhile)."""

    async def probe_then_observe() -> None:
        assert await breaker.aallow(CONFIG) and breaker.is_probe(CONFIG)
        await breaker.aobserve(CONFIG, result(False))

    _cancelled_at_read(clock, tmp_path, 3, probe_then_observe)


def test_a_cancellation_after_aallow_took_the_slot_gives_it_back(
    clock: FakeClock, tmp_path: Any
) -> None:
    """Cancelled at ``aallow``'s second read of the circuit (the slot is taken, the
    claim not yet this context's): the slot is given back, not held until its TTL."""

    async def claim() -> None:
        await breaker.aallow(CONFIG)

    _cancelled_at_read(clock, tmp_path, 2, claim)


def _ask(effect: Effect) -> Generator[Effect, Any, Any]:
    """A core that asks for one effect and returns what it received."""
    return (yield effect)


def _drivers() -> list[Any]:
    return [effects.run, lambda core: asyncio.run(effects.arun(core))]


def test_peek_circuit_reads_the_circuit_on_both_drivers_without_claiming(
    clock: FakeClock,
) -> None:
    trip()
    for drive in _drivers():
        assert drive(_ask(PeekCircuit(CONFIG))) is False  # open
    clock.advance(1.0)
    for drive in _drivers():
        assert drive(_ask(PeekCircuit(CONFIG))) is True  # half-open, the slot free
    assert breaker.allow(CONFIG) and breaker.is_probe(CONFIG)  # no peek took the slot
    for drive in _drivers():
        assert drive(_ask(PeekCircuit(CONFIG))) is False  # the probe is out


def test_a_failing_breaker_lets_the_call_through_on_both_drivers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Allow and PeekCircuit are quiet: whatever fails inside the breaker (here its
    clock), the drivers log it and the candidate is tried (fail open)."""

    def stopped() -> float:
        raise RuntimeError("the clock stopped")

    monkeypatch.setattr(breaker, "store", CircuitStore(clock=stopped))
    for effect in (Allow(CONFIG), PeekCircuit(CONFIG)):
        for drive in _drivers():
            assert drive(_ask(effect)) is True
    logged = [r.getMessage() for r in caplog.records if "routing goes on" in r.getMessage()]
    assert (
        logged
        == ["Allow failed (RuntimeError); routing goes on without it."] * 2
        + ["PeekCircuit failed (RuntimeError); routing goes on without it."] * 2
    )
