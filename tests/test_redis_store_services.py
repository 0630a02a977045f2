"""The app's own Redis clients on the real Redis: values on the wire are the app's
JSON (never pickle), keys are the cache alias's, REDIS_URL alone (the default cache
local) shares circuit state between two processes' stores, and none of it touches
Django's RedisCacheClient."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
import redis
from django.core.cache.backends.redis import RedisCacheClient
from django.test import override_settings

from llm_routing.cache import RedisStore, routing_cache
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import CircuitStore
from llm_routing.types import ErrorInfo, ProviderConfig, ProviderResult

pytestmark = pytest.mark.services

URL = os.environ.get("LLMR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def test_values_on_the_wire_are_json_under_the_alias_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for private in ("get_client", "_get_connection_pool", "_get_connection_pool_index"):
        monkeypatch.delattr(RedisCacheClient, private)  # the app needs none of them
    store = routing_cache()
    assert isinstance(store, RedisStore)
    key = f"llmr-store-{uuid.uuid4().hex}"
    store.set(key, {"state": "open", "failures": 3}, 30)
    raw = redis.Redis.from_url(URL).get(store.make_key(key))
    assert raw == b'{"state":"open","failures":3}'
    assert store.get(key) == {"state": "open", "failures": 3}
    assert asyncio.run(store.aio.get(key)) == {"state": "open", "failures": 3}
    assert store.add(key + ":probe", "t", 30) and not store.add(key + ":probe", "u", 30)
    assert store.get_many([key + ":probe", key + ":none"]) == {key + ":probe": "t"}
    assert store.delete(key) and store.delete(key + ":probe")


def test_redis_url_alone_shares_circuits_between_workers() -> None:
    """The default cache process-local, REDIS_URL set: two stores (two workers'
    worth) see one circuit state."""
    config = ProviderConfig(
        name=f"p{uuid.uuid4().hex[:8]}", kind="openai_compatible", model="m", timeout_s=5.0
    )
    failed = ProviderResult(
        provider=config.name,
        model=config.model,
        mode="error",
        status="error",
        error=ErrorInfo(category="server", message="503", http_status=503, transient=True),
        upstream_requests=1,
    )
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(CACHES=caches, LLM_ROUTING={"REDIS_URL": URL}):
        assert isinstance(routing_cache(), RedisStore)
        one, other = CircuitStore(), CircuitStore()
        original = breaker.store
        try:
            breaker.store = one
            for _ in range(int(breaker.Policy.from_settings().threshold)):
                breaker.observe(config, failed)
            assert not breaker.allow(config)
            breaker.store = other  # another worker's store: reads the same Redis
            assert not breaker.allow(config)
            other.reset(config.name, config.model)
            assert breaker.allow(config)
        finally:
            breaker.store = original
