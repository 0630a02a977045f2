"""The least_in_flight strategy's leases on the real Redis (llm_routing.balance): the
sync and the async paths share one count per provider, a lease given back leaves it,
and the leases of a worker that never gives them back expire on their own."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from llm_routing import balance, effects
from llm_routing.cache import async_redis, routing_cache

pytestmark = pytest.mark.services


class Clock:
    def __init__(self) -> None:
        self.now = 2_000_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    fake = Clock()
    monkeypatch.setattr(balance, "clock", fake)
    yield fake


def _lease(name: str) -> Any:
    return (yield balance.Lease(name))


def _unlease(name: str, lease: str) -> Any:
    return (yield balance.Unlease(name, lease))


def _count(names: tuple[str, ...]) -> Any:
    return (yield balance.CountInFlight(names))


def test_leases_are_shared_and_expire(clock: Clock) -> None:
    assert async_redis(routing_cache()) is not None, "the services suite runs on Redis"
    a, b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    mine = effects.run(_lease(a))  # the sync path (a worker thread)
    crashed = asyncio.run(effects.arun(_lease(a)))  # the async path (another worker)
    asyncio.run(effects.arun(_lease(b)))
    assert effects.run(_count((a, b))) == {a: 2, b: 1}
    assert asyncio.run(effects.arun(_count((a, b)))) == {a: 2, b: 1}
    effects.run(_unlease(a, mine))
    assert effects.run(_count((a, b))) == {a: 1, b: 1}
    assert crashed  # never given back: it expires
    clock.now += balance.lease_s() + 1
    assert asyncio.run(effects.arun(_count((a, b)))) == {a: 0, b: 0}


def _recall(key: str) -> Any:
    return (yield balance.Recall(key))


def _remember(key: str, name: str, ttl: float) -> Any:
    return (yield balance.Remember(key, name, ttl))


def test_affinity_is_shared_by_the_sync_and_async_paths() -> None:
    key = balance.affinity_cache_key("main", 0, f"conversation-{uuid.uuid4().hex}")
    assert effects.run(_recall(key)) is None
    asyncio.run(effects.arun(_remember(key, "oa-key2", 30)))  # an async worker answered
    assert effects.run(_recall(key)) == "oa-key2"  # a sync worker reads it
    effects.run(_remember(key, "oa-key1", 30))
    assert asyncio.run(effects.arun(_recall(key))) == "oa-key1"
    ttl = routing_cache().client.ttl(routing_cache().make_key(key))
    assert 0 < ttl <= 30
