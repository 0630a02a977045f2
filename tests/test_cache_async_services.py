"""The routing cache's async Redis path (redis.asyncio, llm_routing.cache.AsyncRedis)
on the real Redis: the same keys and values as the sync path, Django's add/set/delete
semantics, and the breaker's async calls sharing circuit state with its sync calls."""

from __future__ import annotations

import asyncio
import gc
import os
import uuid
import weakref

import pytest

from llm_routing.cache import async_redis, raw_redis, routing_cache
from llm_routing.resilience import breaker
from llm_routing.types import ErrorInfo, ProviderConfig, ProviderResult

pytestmark = pytest.mark.services


def test_async_redis_shares_keys_and_values_with_the_sync_cache() -> None:
    cache = routing_cache()
    aredis = async_redis(cache)
    assert aredis is not None, "the services suite runs the routing cache on Redis"
    key = f"llmr-async-{uuid.uuid4().hex}"

    async def go() -> tuple[object, ...]:
        await aredis.set(key, {"state": "open", "n": 3}, 30)
        first_add = await aredis.add(key + ":probe", "token-a", 30)
        second_add = await aredis.add(key + ":probe", "token-b", 30)
        many = await aredis.get_many([key, key + ":probe", key + ":none"])
        deleted = await aredis.delete(key + ":probe")
        return first_add, second_add, many, deleted, await aredis.get(key + ":probe")

    first_add, second_add, many, deleted, gone = asyncio.run(go())
    assert (first_add, second_add, deleted, gone) == (True, False, True, None)
    assert many == {key: {"state": "open", "n": 3}, key + ":probe": "token-a"}
    assert cache.get(key) == {"state": "open", "n": 3}  # written async, read sync
    cache.set(key, 7, 30)
    assert asyncio.run(aredis.get(key)) == 7  # written sync (an int), read async
    cache.delete(key)


def test_the_breakers_async_path_sees_what_the_sync_path_wrote() -> None:
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
    assert asyncio.run(breaker.aallow(config))
    for _ in range(int(breaker.Policy.from_settings().threshold)):
        breaker.observe(config, failed)  # the sync path opens the circuit
    assert not asyncio.run(breaker.aallow(config))  # the async path reads it open
    breaker.store.reset(config.name, config.model)
    assert breaker.allow(config)

    async def fail_async() -> None:
        for _ in range(int(breaker.Policy.from_settings().threshold)):
            await breaker.aobserve(config, failed)

    asyncio.run(fail_async())
    assert not breaker.allow(config)  # written by the async path, read by the sync one
    breaker.store.reset(config.name, config.model)


def test_more_commands_in_flight_than_the_pool_holds_wait_for_a_connection() -> None:
    """A loop holding many requests has many Redis commands in flight at once (circuit
    reads, throttle scripts). Past the pool's size a command waits for a connection;
    redis-py's default asyncio pool raised MaxConnectionsError past 100 instead, and
    the breaker fell back to process-local state (no longer shared by the workers) for
    CACHE_RETRY_S. Here 300 commands each hold a connection for 0.2 s (a BLPOP on an
    empty list) through the loop's client."""
    from llm_routing.cache import ASYNC_POOL_SIZE

    aredis = async_redis(routing_cache())
    assert aredis is not None, "the services suite runs the routing cache on Redis"
    empty = f"llmr-async-empty-{uuid.uuid4().hex}"

    async def all_at_once() -> list[object]:
        client = aredis.client()
        return list(
            await asyncio.gather(
                *(client.blpop([empty], timeout=0.2) for _ in range(3 * ASYNC_POOL_SIZE)),
                return_exceptions=True,
            )
        )

    answers = asyncio.run(all_at_once())
    assert {type(a).__name__ for a in answers} == {"NoneType"}, answers[:3]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _connections_to_this_db(cache: object) -> int:
    """Clients connected to the routing cache's Redis database (CLIENT LIST's ``db``)."""
    client = raw_redis(cache)
    assert client is not None
    db = client.connection_pool.connection_kwargs.get("db", 0)
    return sum(1 for c in client.client_list() if int(c.get("db", -1)) == int(db))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_a_closed_event_loops_client_is_let_go() -> None:
    """Each event loop gets its own redis.asyncio client (an asyncio connection belongs to
    its loop). Keyed weakly by the loop, a client was never let go: its connections
    hold the loop, so every ``asyncio.run()`` (every ``async_to_sync`` call, every task
    that runs ``achat`` in its own loop) kept a client, a pool and a socket for the life
    of the process. Now a closed loop's client is dropped when the next loop asks for
    one: whatever the number of short loops, the clients held, the process's open files
    and the server's connections stay put."""
    cache = routing_cache()
    aredis = async_redis(cache)
    assert aredis is not None, "the services suite runs the routing cache on Redis"
    key = f"llmr-async-loops-{uuid.uuid4().hex}"
    loops_seen: list[weakref.ReferenceType[asyncio.AbstractEventLoop]] = []

    async def use_the_cache() -> object:
        loops_seen.append(weakref.ref(asyncio.get_running_loop()))
        await aredis.run_script("return 1", [], [])  # a script (registered once) too
        return await aredis.get(key)

    asyncio.run(use_the_cache())  # the first loop: one client (and its socket) at most
    gc.collect()
    loops, fds, server = aredis.loops(), _open_fds(), _connections_to_this_db(cache)
    for _ in range(12):
        asyncio.run(use_the_cache())
    gc.collect()
    assert loops == 1 and aredis.loops() == 1  # the last loop's, closed since
    assert _open_fds() <= fds
    assert _connections_to_this_db(cache) <= server
    # No closed loop is kept alive but the last (not by its client, not by a script).
    assert [ref() is None for ref in loops_seen] == [True] * 12 + [False]
