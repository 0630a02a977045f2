"""Shared fixtures: users, API clients, provider rows, test adapter kinds, and the fake
upstream server speaking the vendors' wire formats."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, ClassVar

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from llm_routing import budgets, snapshot
from llm_routing.api.authentication import clear_token_cache
from llm_routing.errors import ProviderError
from llm_routing.models import Chain, ChainEntry, Provider
from llm_routing.providers import registry
from llm_routing.providers.base import BaseProvider, HttpProvider
from llm_routing.providers.registry import clear_adapter_cache, get_adapter_class
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import CircuitStore
from llm_routing.types import (
    AuditRequest,
    ProviderConfig,
    ProviderResult,
    StreamDelta,
    StreamEnd,
    StreamEvent,
    StreamToolCallDelta,
    Usage,
)
from tests import drivers
from tests.breaker_support import FakeClock
from tests.fakes.upstream import FakeUpstream


class ScriptedProvider(BaseProvider):
    """A custom adapter kind (registered like any host project's kind) whose answers
    come from a per-provider script; used to drive the router's walk in tests."""

    kind: ClassVar[str] = "scripted"
    requires_key: ClassVar[bool] = True
    scripts: ClassVar[dict[str, list[Any]]] = {}
    calls: ClassVar[list[tuple[str, str | None]]] = []
    # name -> list of streams; each stream a list of str (a delta), "END", an exception,
    # or a StreamEvent yielded as is (a tool-call fragment, a StreamEnd)
    streams: ClassVar[dict[str, list[list[Any]]]] = {}
    prefills: ClassVar[list[tuple[str, str]]] = []
    requests: ClassVar[list[tuple[str, AuditRequest]]] = []  # (provider, request seen)

    def stream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> Iterator[StreamEvent]:
        type(self).calls.append((self.config.name, api_key))
        type(self).prefills.append((self.config.name, request.prefill))
        type(self).requests.append((self.config.name, request))
        queue = type(self).streams.get(self.config.name) or [["answer ", "END"]]
        steps = queue.pop(0) if len(queue) > 1 else queue[0]
        for step in steps:
            if isinstance(step, BaseException):
                raise step
            if isinstance(step, StreamEnd):
                yield step
                return
            if isinstance(step, StreamToolCallDelta):
                yield step
                continue
            if step == "END":
                yield StreamEnd(
                    finish_reason="stop", usage=Usage(input_tokens=2, output_tokens=len(steps))
                )
                return
            yield StreamDelta(step)

    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        type(self).calls.append((self.config.name, api_key))
        type(self).requests.append((self.config.name, request))
        script = type(self).scripts.get(self.config.name) or ["ok"]
        step = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, ProviderResult):
            return replace(step, provider=self.config.name, model=self.config.model)
        return ProviderResult(
            provider=self.config.name,
            model=self.config.model,
            mode="live",
            status="ok",
            output=f"answer from {self.config.name}",
            usage=Usage(input_tokens=3, output_tokens=4),
        )


class KeylessScriptedProvider(ScriptedProvider):
    kind: ClassVar[str] = "scripted_keyless"
    requires_key: ClassVar[bool] = False


@pytest.fixture
def scripted() -> Iterator[type[ScriptedProvider]]:
    registry.register("scripted", ScriptedProvider)
    registry.register("scripted_keyless", KeylessScriptedProvider)
    ScriptedProvider.scripts = {}
    ScriptedProvider.calls = []
    ScriptedProvider.streams = {}
    ScriptedProvider.prefills = []
    ScriptedProvider.requests = []
    yield ScriptedProvider
    registry.clear_adapter_cache()


@pytest.fixture
def key_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """A canary key value set in TEST_PROVIDER_KEY."""
    value = "sk-canary-KEY-0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    monkeypatch.setenv("TEST_PROVIDER_KEY", value)
    return value


def make_provider(name: str, *, kind: str = "scripted", **fields: Any) -> Provider:
    fields.setdefault("model", f"{name}-model")
    fields.setdefault("api_key_env", "TEST_PROVIDER_KEY" if kind.startswith("scripted") else "")
    return Provider.objects.create(name=name, kind=kind, **fields)


def make_chain(name: str, providers: list[Provider], *, is_default: bool = False) -> Chain:
    chain = Chain.objects.create(name=name, is_default=is_default)
    for position, provider in enumerate(providers):
        ChainEntry.objects.create(chain=chain, provider=provider, position=position)
    return chain


@pytest.fixture(params=drivers.DRIVERS)
def driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test once per router driver: a module opting in with
    ``pytest.mark.usefixtures("driver")`` calls ``route`` / ``route_stream`` through
    ``aroute`` / ``aroute_stream`` in its "async" run (tests/drivers.py)."""
    drivers.use(request.param, request.module, monkeypatch)
    return str(request.param)


#: The async upstream transports (LLM_ROUTING["ASYNC_HTTP_TRANSPORT"]).
ASYNC_TRANSPORTS = ("aiohttp", "httpx")


@pytest.fixture(params=ASYNC_TRANSPORTS)
def async_transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test once per async upstream transport. The setting's default is
    switched (not ``settings.LLM_ROUTING``), so a test's own
    ``override_settings(LLM_ROUTING=...)`` keeps the transport; adapters built before
    are dropped, so each run builds its clients anew."""
    from llm_routing import conf

    saved = conf.DEFAULTS["ASYNC_HTTP_TRANSPORT"]
    conf.DEFAULTS["ASYNC_HTTP_TRANSPORT"] = request.param
    conf.routing_settings.reload()
    clear_adapter_cache()
    try:
        yield str(request.param)
    finally:
        clear_adapter_cache()
        conf.DEFAULTS["ASYNC_HTTP_TRANSPORT"] = saved
        conf.routing_settings.reload()


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="alice", password="pw-alice-123")


@pytest.fixture
def api(user: Any) -> APIClient:
    client = APIClient()
    token = Token.objects.create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def anon() -> APIClient:
    return APIClient()


@pytest.fixture(autouse=True)
def _clear_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from django.core.cache import caches

    for alias in caches:
        caches[alias].clear()
    # A fresh circuit store: a test whose cache failed leaves the process store on its
    # process-local fallback for CACHE_RETRY_S (wall time), and that state is no cache
    # the line above clears — circuits would carry over into the next tests.
    monkeypatch.setattr(breaker, "store", CircuitStore())
    # The test database is rolled back after each test (no signal): forget the snapshot.
    snapshot.clear()
    clear_token_cache()
    budgets.reset_cache_state()  # budget rows cached per process, outlive a rollback
    yield
    snapshot.clear()
    clear_token_cache()
    registry.clear_adapter_cache()


@pytest.fixture
def fake_upstream() -> Iterator[FakeUpstream]:
    """A real HTTP server on 127.0.0.1 (ephemeral port) speaking the vendors' formats."""
    server = FakeUpstream().start()
    try:
        yield server
    finally:
        clear_adapter_cache()
        server.stop()


VENDOR_OF_KIND = {
    "openai": "openai",
    "openai_compatible": "openai",
    "anthropic": "anthropic",
    "gemini": "gemini",
}


def base_url_for(kind: str, fake: FakeUpstream) -> str:
    """The base_url a provider row of ``kind`` uses to reach the fake upstream."""
    return f"{fake.url}/v1" if VENDOR_OF_KIND.get(kind) == "openai" else fake.url


def upstream_fields(name: str, kind: str, fake: FakeUpstream) -> dict[str, Any]:
    """Provider fields of ``kind`` pointed at the fake upstream."""
    return {
        "name": name,
        "kind": kind,
        "model": f"{kind}-model",
        "base_url": base_url_for(kind, fake),
        "api_key_env": "TEST_PROVIDER_KEY",
        "timeout_s": 5.0,
        "first_token_timeout_s": 5.0,
        "max_retries": 2,
        "supports_structured_output": True,
    }


@pytest.fixture
def make_adapter(fake_upstream: FakeUpstream) -> Iterator[Callable[..., HttpProvider]]:
    """Build an adapter of a kind pointed at the fake upstream; closed after the test."""
    built: list[HttpProvider] = []

    def factory(kind: str, **overrides: Any) -> HttpProvider:
        fields = upstream_fields(f"{kind.replace('_', '-')}-test", kind, fake_upstream)
        fields.update({"model": "model-x", **overrides})
        adapter = get_adapter_class(kind)(ProviderConfig(**fields))
        assert isinstance(adapter, HttpProvider)
        built.append(adapter)
        return adapter

    yield factory
    for adapter in built:
        adapter.close()


class Sleeps(list[float]):
    """An injectable sleeper that records each wait and never sleeps."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def upstream_chain(fake_upstream: FakeUpstream) -> Callable[..., list[Any]]:
    """Create Provider rows pointed at the fake upstream and a default Chain of them.

    ``upstream_chain(("oc", "openai_compatible", {...overrides}), ("an", "anthropic", {}))``
    """
    from llm_routing.models import Chain, ChainEntry, Provider

    def factory(*specs: tuple[str, str, dict[str, Any]]) -> list[Provider]:
        chain = Chain.objects.create(name="default", is_default=True)
        rows = []
        for position, (name, kind, overrides) in enumerate(specs):
            fields = upstream_fields(name, kind, fake_upstream)
            fields.update(overrides)
            row = Provider.objects.create(**fields)
            ChainEntry.objects.create(chain=chain, provider=row, position=position)
            rows.append(row)
        return rows

    return factory


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, settings: Any) -> FakeClock:
    """Circuits on a fake clock, in a fresh LocMem cache per test (never clear() a
    shared Redis)."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": f"breaker-{uuid.uuid4().hex}",
        }
    }
    fake = FakeClock()
    monkeypatch.setattr(breaker, "store", CircuitStore(clock=fake))
    return fake


__all__ = [
    "KeylessScriptedProvider",
    "ProviderError",
    "ScriptedProvider",
    "make_chain",
    "make_provider",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Browser tests run last: Playwright's sync API leaves an event loop running in the
    main thread for the rest of the session (see tests/test_browser.py)."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)
