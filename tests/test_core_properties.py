"""Property tests (hypothesis) where the input space is too large for examples (issue 17):

* the circuit breaker, driven through its store on a fake clock by random sequences of
  outcomes and clock steps, agrees with a small reference model of the documented
  state machine;
* the retry layer never sleeps past the request-wide deadline and never sends more
  requests than the attempt budget allows;
* the router's walk never sends more upstream requests than ``MAX_ATTEMPTS``.

Examples are derandomized (the same on every run, so a mutation run and CI see the same
inputs) and have no per-example deadline (the machine is shared).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llm_routing.errors import (
    InvalidRequestError,
    NetworkError,
    ProviderError,
    RateLimitError,
    UnavailableError,
)
from llm_routing.models import Provider
from llm_routing.resilience.breaker import CLOSED, HALF_OPEN, OPEN, CircuitStore
from llm_routing.resilience.budget import MIN_ATTEMPT_S, Budget
from llm_routing.resilience.retry import call_with_retries
from llm_routing.router import route
from llm_routing.types import AuditRequest, ErrorInfo, ProviderConfig, ProviderResult

from .breaker_support import FakeClock
from .conftest import KeylessScriptedProvider, ScriptedProvider, make_chain, make_provider

# Every routed call in this module runs against both drivers (tests/drivers.py).
pytestmark = pytest.mark.usefixtures("driver")


PROPERTY = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
REQUEST = AuditRequest(task="t", input_text="x")

# --- the breaker against a reference model ---------------------------------------------------

THRESHOLD, LADDER, COOLDOWN_MAX, RESET_AFTER = 3, (1.0, 2.0, 5.0, 10.0), 8.0, 30.0
RETRY_AFTER_CAP, RETRY_AFTER_MAX = 5.0, 40.0
BREAKER_SETTINGS = {
    "BREAKER_FAILURE_THRESHOLD": THRESHOLD,
    "BREAKER_COOLDOWNS_S": list(LADDER),
    "BREAKER_COOLDOWN_MAX_S": COOLDOWN_MAX,
    "BREAKER_RESET_AFTER_S": RESET_AFTER,
    "RETRY_AFTER_CAP_S": RETRY_AFTER_CAP,
    "BREAKER_RETRY_AFTER_MAX_S": RETRY_AFTER_MAX,
}
CONFIG = ProviderConfig(name="p", kind="openai", model="m", timeout_s=5.0)


@dataclass
class Model:
    """The documented breaker, written plainly: one (provider, model), one caller."""

    open_until: float | None = None  # None: closed
    failures: int = 0
    level: int = 0
    last_failure: float | None = None

    def phase(self, now: float) -> str:
        if self.open_until is None:
            return CLOSED
        return HALF_OPEN if now >= self.open_until else OPEN

    def quiet(self, now: float) -> bool:
        return self.last_failure is None or now - self.last_failure >= RESET_AFTER

    def trip(self, now: float, retry_after: float | None) -> None:
        cooldown = min(LADDER[min(self.level, len(LADDER) - 1)], COOLDOWN_MAX)
        if retry_after is not None and retry_after > RETRY_AFTER_CAP:
            cooldown = max(cooldown, min(retry_after, RETRY_AFTER_MAX))
        self.open_until = now + cooldown
        self.level += 1

    def success(self, now: float) -> None:
        if self.quiet(now):
            self.level = 0
        self.open_until, self.failures = None, 0

    def failure(self, now: float, counted: bool, retry_after: float | None) -> None:
        probing = self.phase(now) == HALF_OPEN
        if not counted:  # the provider answered: a probe that got an answer closes
            if probing:
                self.open_until, self.failures = None, 0
            return
        if not probing and self.quiet(now):
            self.failures, self.level = 0, 0
        self.failures += 1
        self.last_failure = now
        long_429 = retry_after is not None and retry_after > RETRY_AFTER_CAP
        if probing or self.failures >= THRESHOLD or long_429:
            self.trip(now, retry_after)


OUTCOMES: dict[str, ErrorInfo | None] = {
    "ok": None,
    "503": UnavailableError(http_status=503).to_info(),
    "timeout": ErrorInfo(category="timeout", message="slow", transient=True),
    "400": InvalidRequestError(http_status=400).to_info(),
    "context": ErrorInfo(category="context_length", message="long", transient=True),
    "429": RateLimitError(http_status=429, retry_after=2.0).to_info(),
    "429-long": RateLimitError(http_status=429, retry_after=12.0).to_info(),
    "429-huge": RateLimitError(http_status=429, retry_after=900.0).to_info(),
}
STEPS = st.one_of(
    st.sampled_from(sorted(OUTCOMES)),
    st.sampled_from([0.5, 1.0, 2.0, 4.5, 10.0, 31.0]).map(lambda s: ("wait", s)),
)


@given(steps=st.lists(STEPS, max_size=40))
@settings(parent=PROPERTY, max_examples=200)
def test_the_breaker_follows_the_reference_model(clock: FakeClock, steps: list[Any]) -> None:
    caches["default"].clear()
    clock.now = 1_900_000_000.0
    store, model = CircuitStore(clock=clock), Model()
    with override_settings(LLM_ROUTING=BREAKER_SETTINGS):
        for step in steps:
            now = clock()
            if isinstance(step, tuple):
                clock.advance(step[1])
                continue
            expected = model.phase(now)
            allowed = store.allow(CONFIG)
            assert allowed is (expected != OPEN), (step, expected)
            if not allowed:
                continue
            error = OUTCOMES[step]
            store.observe(
                CONFIG,
                ProviderResult(
                    provider="p",
                    model="m",
                    mode="live" if error is None else "error",
                    status="ok" if error is None else "error",
                    error=error,
                    upstream_requests=1,
                ),
            )
            if error is None:
                model.success(now)
            else:
                counted = error.transient and error.category != "context_length"
                model.failure(now, counted, error.retry_after_s)
            circuit = store.load("p", "m")
            assert circuit.phase(now) == model.phase(now), step
            assert circuit.failures == model.failures, step
            assert circuit.level == model.level, step
            if model.open_until is not None:
                assert circuit.open_until == model.open_until, step
            assert not store.is_probe(CONFIG)  # every reported probe freed its slot


# --- the retry layer: never past the deadline ----------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


ERRORS = st.sampled_from(
    [
        UnavailableError(http_status=503),
        NetworkError("reset"),
        RateLimitError(http_status=429),
        RateLimitError(http_status=429, retry_after=0.0),
        RateLimitError(http_status=429, retry_after=1.5),
        RateLimitError(http_status=429, retry_after=4.0),
    ]
)


@given(
    failures=st.lists(ERRORS, max_size=8),
    deadline=st.floats(min_value=0.0, max_value=6.0),
    max_attempts=st.integers(min_value=0, max_value=8),
    max_retries=st.integers(min_value=0, max_value=6),
    base=st.sampled_from([0.1, 0.5, 1.0, 2.0]),
    jitter=st.floats(min_value=0.0, max_value=1.0),
    overrun=st.sampled_from([0.0, 0.0, 0.3, 2.0]),
)
@example(  # a Retry-After that fits the deadline but leaves no time for the request
    failures=[RateLimitError(http_status=429, retry_after=1.5)],
    deadline=1.52,
    max_attempts=3,
    max_retries=2,
    base=0.1,
    jitter=0.5,
    overrun=0.0,
)
@PROPERTY
def test_retries_never_sleep_past_the_deadline(
    scripted: type[ScriptedProvider],
    failures: list[ProviderError],
    deadline: float,
    max_attempts: int,
    max_retries: int,
    base: float,
    jitter: float,
    overrun: float,
) -> None:
    """``overrun``: a real sleep may last longer than asked."""
    clock = Clock()
    budget = Budget(deadline_s=deadline, max_attempts=max_attempts, clock=clock)
    adapter = KeylessScriptedProvider(
        ProviderConfig(name="a", kind="scripted_keyless", model="m", max_retries=max_retries)
    )
    # Set on the base class: the keyless kind shares its scripts (and the ``scripted``
    # fixture of later tests resets them).
    ScriptedProvider.scripts = {"a": [*failures, "ok"]}
    ScriptedProvider.calls = []
    starts: list[float] = []
    original = adapter.complete

    def complete(request: AuditRequest, *, api_key: str | None, timeout: float) -> Any:
        starts.append(clock.now)
        assert 0.0 <= timeout <= budget.remaining()  # the attempt ends inside the deadline
        return original(request, api_key=api_key, timeout=timeout)

    adapter.complete = complete  # type: ignore[method-assign]
    slept: list[float] = []

    def sleeper(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds + overrun

    settings_ = {"BACKOFF_BASE_S": base, "BACKOFF_MAX_S": 4.0, "RETRY_AFTER_CAP_S": 5.0}
    with override_settings(LLM_ROUTING=settings_):
        out = call_with_retries(
            adapter, REQUEST, budget=budget, sleeper=sleeper, rng=lambda: jitter
        )
    assert sum(slept) <= deadline
    assert all(s >= 0 for s in slept)
    assert out.upstream_requests == len(starts) <= max_attempts
    assert out.retries == max(0, len(starts) - 1) <= max_retries
    for started in starts:  # every request started with time left to run
        assert deadline - started >= MIN_ATTEMPT_S
    if overrun == 0.0:  # a wait is only taken when a request can follow it
        assert len(slept) == max(0, len(starts) - 1)
    assert out.ok is (len(starts) == len(failures) + 1)


# --- the walk: never more upstream requests than MAX_ATTEMPTS ---------------------------------


@pytest.fixture
def chain_of_five(scripted: type[ScriptedProvider]) -> list[Provider]:
    os.environ.setdefault("TEST_PROVIDER_KEY", "sk-property-0123456789")
    rows = [make_provider(f"p{i}") for i in range(5)]
    make_chain("main", rows, is_default=True)
    return rows


@pytest.mark.django_db
@given(
    max_attempts=st.integers(min_value=1, max_value=8),
    retries=st.lists(st.integers(min_value=0, max_value=3), min_size=5, max_size=5),
    scripts=st.lists(st.lists(ERRORS, max_size=5), min_size=5, max_size=5),
)
@PROPERTY
def test_the_walk_never_sends_more_than_max_attempts(
    chain_of_five: list[Provider],
    clock: FakeClock,
    max_attempts: int,
    retries: list[int],
    scripts: list[list[ProviderError]],
) -> None:
    caches["default"].clear()
    for row, n in zip(chain_of_five, retries, strict=True):
        Provider.objects.filter(pk=row.pk).update(max_retries=n)
    ScriptedProvider.scripts = {
        row.name: [*script, "ok"] for row, script in zip(chain_of_five, scripts, strict=True)
    }
    ScriptedProvider.calls = []
    with override_settings(LLM_ROUTING={"MAX_ATTEMPTS": max_attempts, "DEFAULT_CHAIN": []}):
        routed = route(REQUEST, sleeper=lambda s: None, persist=False)
    sent = len(ScriptedProvider.calls)
    assert sent <= max_attempts
    tried = [a for a in routed.metadata.attempts if a.outcome != "skipped"]
    assert sum(a.retries + 1 for a in tried if a.provider != "mock") == sent
    assert routed.result.ok  # the mock backstop answers whatever was spent
    if sent == max_attempts and routed.result.provider == "mock":
        skipped = {a.reason for a in routed.metadata.attempts if a.outcome == "skipped"}
        assert skipped <= {"budget_exhausted", "circuit_open"}


def test_the_reference_model_is_not_the_code_under_test() -> None:
    """A sanity check of the model itself: three transient failures open for 1 s, the
    probe's failure climbs the ladder, a quiet success resets it."""
    m = Model()
    for _ in range(3):
        m.failure(0.0, True, None)
    assert (m.phase(0.5), m.phase(1.0), m.level) == (OPEN, HALF_OPEN, 1)
    m.failure(1.0, True, None)
    assert (m.open_until, m.level) == (3.0, 2)
    m.success(100.0)
    assert (m.phase(100.0), m.level, m.failures) == (CLOSED, 0, 0)
    assert replace(m) == m
