"""Shared fixtures: the fake upstream server and a clean adapter pool per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llm_routing.providers.base import HttpProvider
from llm_routing.providers.registry import clear_adapter_cache, get_adapter_class
from llm_routing.types import ProviderConfig
from tests.fakes.upstream import FakeUpstream


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


@pytest.fixture
def make_adapter(fake_upstream: FakeUpstream) -> Iterator[Callable[..., HttpProvider]]:
    """Build an adapter of a kind pointed at the fake upstream; closed after the test."""
    built: list[HttpProvider] = []

    def factory(kind: str, **overrides: Any) -> HttpProvider:
        fields: dict[str, Any] = {
            "name": f"{kind.replace('_', '-')}-test",
            "kind": kind,
            "model": "model-x",
            "base_url": base_url_for(kind, fake_upstream),
            "api_key_env": "TEST_PROVIDER_KEY",
            "timeout_s": 5.0,
            "first_token_timeout_s": 5.0,
            "max_retries": 2,
            "supports_structured_output": True,
        }
        fields.update(overrides)
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
def make_chain(fake_upstream: FakeUpstream) -> Callable[..., list[Any]]:
    """Create Provider rows pointed at the fake upstream and a default Chain of them.

    ``make_chain(("oc", "openai_compatible", {...overrides}), ("an", "anthropic", {}))``
    """
    from llm_routing.models import Chain, ChainEntry, Provider

    def factory(*specs: tuple[str, str, dict[str, Any]]) -> list[Provider]:
        chain = Chain.objects.create(name="default", is_default=True)
        rows = []
        for position, (name, kind, overrides) in enumerate(specs):
            fields: dict[str, Any] = {
                "name": name,
                "kind": kind,
                "model": f"{kind}-model",
                "base_url": base_url_for(kind, fake_upstream),
                "api_key_env": "TEST_PROVIDER_KEY",
                "timeout_s": 5.0,
                "first_token_timeout_s": 5.0,
                "max_retries": 2,
                "supports_structured_output": True,
            }
            fields.update(overrides)
            row = Provider.objects.create(**fields)
            ChainEntry.objects.create(chain=chain, provider=row, position=position)
            rows.append(row)
        return rows

    return factory
