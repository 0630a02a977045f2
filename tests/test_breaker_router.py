"""The breaker inside the router: circuit_open skips, single-request probes, forced mode,
/health/, the admin column and action, the management command, a flapping provider.

The upstreams are real local HTTP servers called over httpx (tests/breaker_support.py).
The flapping test runs on LocMem here and on the real Redis in the services suite.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.cache import caches
from django.core.management import CommandError, call_command
from django.test import Client, override_settings

from llm_routing.models import Attempt, Chain, ChainEntry, Provider
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import CLOSED, HALF_OPEN, OPEN, Policy
from llm_routing.router import route
from llm_routing.types import AuditRequest

from .breaker_support import KIND, FakeClock, FakeUpstream, install

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("driver")]

REQUEST = AuditRequest(task="summarize", input_text="hello")
REDIS_URL = (
    os.environ.get("LLMR_TEST_REDIS_URL")
    or os.environ.get("REDIS_URL")
    or "redis://127.0.0.1:6379/4"
)


def no_sleep(seconds: float) -> None:
    return None


@pytest.fixture
def dead(clock: FakeClock) -> Iterator[FakeUpstream]:
    with FakeUpstream(status=503, clock=clock) as upstream:
        yield upstream


@pytest.fixture
def healthy(clock: FakeClock) -> Iterator[FakeUpstream]:
    with FakeUpstream(status=200, clock=clock) as upstream:
        yield upstream


@pytest.fixture
def chain(dead: FakeUpstream, healthy: FakeUpstream) -> Chain:
    install()
    primary = Provider.objects.create(
        name="primary", kind=KIND, model="m1", base_url=dead.url, max_retries=2
    )
    backup = Provider.objects.create(name="backup", kind=KIND, model="b1", base_url=healthy.url)
    default = Chain.objects.create(name="main", is_default=True)
    ChainEntry.objects.create(chain=default, provider=primary, position=0)
    ChainEntry.objects.create(chain=default, provider=backup, position=1)
    return default


def trip(n: int = 3) -> None:
    for _ in range(n):
        routed = route(REQUEST, sleeper=no_sleep)
        assert routed.result.provider == "backup"


def test_an_open_circuit_is_skipped_and_recorded_like_every_skip(
    chain: Chain, dead: FakeUpstream, healthy: FakeUpstream
) -> None:
    trip()
    assert dead.requests == 9  # 3 requests x (1 + 2 retries)
    routed = route(REQUEST, sleeper=no_sleep)
    assert dead.requests == 9  # not called again
    meta = routed.metadata.to_dict()
    assert meta["skipped_providers"] == [{"provider": "primary", "reason": "circuit_open"}]
    assert meta["attempted_providers"] == ["backup"]
    assert meta["fallback_used"] is True and meta["fallback_reason"] == "circuit_open"
    assert routed.result.provider == "backup" and routed.result.status == "ok"
    rows = list(Attempt.objects.filter(decision__request_id=routed.request_id).order_by("index"))
    assert [(a.provider, a.outcome, a.reason or None) for a in rows] == [
        ("primary", "skipped", "circuit_open"),
        ("backup", "ok", None),
    ]


def test_the_half_open_probe_is_one_request_without_retries(
    chain: Chain, dead: FakeUpstream, clock: FakeClock
) -> None:
    trip()
    clock.advance(1.0)
    before = dead.requests
    routed = route(REQUEST, sleeper=no_sleep)
    assert dead.requests == before + 1  # the provider has max_retries=2: not used
    assert routed.metadata.attempts[0].outcome == "error"
    assert routed.result.provider == "backup"
    circuit = breaker.store.load("primary", "m1")
    assert circuit.phase(clock()) == OPEN and circuit.open_until == clock() + 2.0


def test_a_healed_provider_gets_traffic_back_through_the_probe(
    chain: Chain, dead: FakeUpstream, clock: FakeClock
) -> None:
    trip()
    dead.status = 200
    assert route(REQUEST, sleeper=no_sleep).result.provider == "backup"  # still open
    clock.advance(1.0)
    assert route(REQUEST, sleeper=no_sleep).result.provider == "primary"  # the probe
    assert route(REQUEST, sleeper=no_sleep).result.provider == "primary"
    assert breaker.store.load("primary", "m1").phase(clock()) == CLOSED


def test_forced_mode_respects_an_open_circuit(chain: Chain, dead: FakeUpstream) -> None:
    # Issue 11: forced calls no longer bypass an open circuit (docs/design-decisions.md).
    trip()
    before = dead.requests
    routed = route(
        AuditRequest(task="debug", input_text="x", force_provider="primary"), sleeper=no_sleep
    )
    assert dead.requests == before
    assert routed.result.provider == "primary" and routed.result.status == "error"
    assert routed.result.error is not None and routed.result.error.category == "circuit_open"


def test_client_errors_never_open_the_circuit(chain: Chain, dead: FakeUpstream) -> None:
    dead.status = 400
    for _ in range(10):
        routed = route(REQUEST, sleeper=no_sleep)
        assert routed.result.error is not None
        assert routed.result.error.category == "invalid_request"
    assert dead.requests == 10
    circuit = breaker.store.load("primary", "m1")
    assert circuit.state == CLOSED and circuit.last_http_status == 400


def test_a_long_retry_after_opens_the_circuit_for_that_long(
    chain: Chain, dead: FakeUpstream, clock: FakeClock
) -> None:
    dead.status, dead.retry_after = 429, 30.0
    route(REQUEST, sleeper=no_sleep)
    assert dead.requests == 1  # over the retry cap: no same-provider retry either
    circuit = breaker.store.load("primary", "m1")
    assert circuit.phase(clock()) == OPEN and circuit.open_until == clock() + 30.0
    clock.advance(29.0)
    route(REQUEST, sleeper=no_sleep)
    assert dead.requests == 1
    clock.advance(1.0)
    assert breaker.store.load("primary", "m1").phase(clock()) == HALF_OPEN


def test_health_endpoint_serves_passive_health(
    chain: Chain, admin_client: Client, clock: FakeClock
) -> None:
    ChainEntry.objects.filter(provider__name="backup").update(model="b2")
    trip()
    resp = admin_client.get("/health/")
    assert resp.status_code == 200
    providers = {p["name"]: p for p in resp.json()["providers"]}
    primary = providers["primary"]
    assert {"name", "kind", "model", "mode", "enabled", "key_present"} <= set(primary)
    assert primary["health"]["state"] == "open"
    assert primary["health"]["model"] == "m1"
    assert primary["health"]["consecutive_failures"] == 3
    assert primary["health"]["last_error_category"] == "unavailable"
    assert primary["health"]["last_http_status"] == 503
    assert primary["health"]["open_until"] is not None
    backup = providers["backup"]
    assert backup["health"]["state"] == "closed" and backup["health"]["last_success_at"] is None
    [override] = backup["overrides"]
    assert override["model"] == "b2" and override["last_success_at"] is not None


def test_admin_shows_the_circuit_and_resets_it(chain: Chain, admin_client: Client) -> None:
    trip()
    page = admin_client.get("/admin/llm_routing/provider/")
    assert page.status_code == 200
    assert 'class="llmr-circuit llmr-circuit-open"' in page.content.decode()
    primary = Provider.objects.get(name="primary")
    resp = admin_client.post(
        "/admin/llm_routing/provider/",
        {"action": "reset_circuits", "_selected_action": [primary.pk]},
        follow=True,
    )
    assert "Reset 1 circuit(s) of 1 provider(s)." in resp.content.decode()
    assert breaker.store.load("primary", "m1").state == CLOSED


def test_management_command_prints_and_resets(chain: Chain) -> None:
    trip()
    out = StringIO()
    call_command("llm_routing_circuits", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split()[:4] == ["provider", "model", "state", "failures"]
    primary = next(line for line in lines if line.startswith("primary"))
    assert primary.split()[1:4] == ["m1", "open", "3"]
    assert "unavailable 503" in primary
    out = StringIO()
    call_command("llm_routing_circuits", "--reset", "primary", "--json", stdout=out)
    text = out.getvalue()
    assert text.startswith("Reset 1 circuit(s) of primary.")
    data = json.loads(text.split("\n", 1)[1])
    states = {(c["provider"], c["state"]) for c in data["circuits"]}
    assert states == {("primary", "closed"), ("backup", "closed")}
    with pytest.raises(CommandError, match="No provider"):
        call_command("llm_routing_circuits", "--reset", "nobody")


# --- a flapping provider (LocMem here; the real Redis in the services suite) -----------


@pytest.fixture(
    params=["locmem", pytest.param("redis", marks=pytest.mark.services)],
)
def circuit_cache(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "locmem":
        yield "locmem"
        return
    caches_setting = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "circuits": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": f"llmr-test-{uuid.uuid4().hex}",
        },
    }
    with override_settings(CACHES=caches_setting, LLM_ROUTING={"CACHE_ALIAS": "circuits"}):
        caches["circuits"].get("ping")  # fails loudly if the real Redis is not there
        yield "redis"


def test_flapping_provider(
    circuit_cache: str, chain: Chain, dead: FakeUpstream, clock: FakeClock
) -> None:
    """503 for 40 s of (fake) time, then healthy; a request every 0.5 s."""
    policy = Policy.from_settings()
    outage_end = clock() + 40.0
    back_at = None
    while clock() < outage_end + 20.0:
        if clock() >= outage_end:
            dead.status = 200
        routed = route(REQUEST, sleeper=no_sleep, persist=False)
        assert routed.result.status == "ok"
        if clock() < outage_end:
            assert routed.result.provider == "backup"  # every outage request is served
        elif routed.result.provider == "primary" and back_at is None:
            back_at = clock()
        if back_at is not None:
            assert routed.result.provider == "primary"  # and stays back
        clock.advance(0.5)
    # Traffic came back within the promised window.
    assert back_at is not None and back_at - outage_end <= 15.0
    # The opening burst: threshold requests x (1 + retries) — then only probes.
    hits = dead.hits
    burst = policy.threshold * 3
    assert len(set(hits[:burst])) == policy.threshold
    probes = [t for t in hits[burst:] if t <= back_at]  # the last one is the good probe
    assert len(probes) == len(set(probes)), "a probe was retried or doubled"
    gaps = [b - a for a, b in zip([hits[burst - 1], *probes], probes, strict=False)]
    for step, gap in enumerate(gaps):
        assert gap >= policy.cooldown(step), (step, gap)
    # One probe per cooldown step: 1 + 2 + 5 + 10 + 10 + ... seconds apart.
    assert 4 <= len(probes) <= 3 + 40.0 // policy.cooldown(3) + 1
    assert probes[-1] == back_at
