"""One cache object, one Redis client, per process for the routing cache.

Django's ``caches[alias]`` is one cache object per thread (per async context), and its
Redis backend builds a new ``redis.Redis`` client on every call
(``RedisCacheClient.get_client``): a worker with 128 threads holds 128 connection pools,
and every call pays for a client object (measured: docs/production.md, "Caches and
their staleness"). The hot path (circuits, throttles, the config version key) goes
through :func:`routing_cache` instead:

* one cache object per process for ``LLM_ROUTING["CACHE_ALIAS"]`` when its backend is
  thread-safe (Redis, LocMem); any other backend is used through ``caches[alias]``;
* for Django's Redis backend, :class:`RedisCache`: the same backend, but one
  ``redis.Redis`` client per connection pool, reused by every call and thread
  (redis-py's clients and pools are thread-safe). A project may name
  ``llm_routing.cache.RedisCache`` in ``CACHES`` to get this everywhere.

:func:`raw_redis` gives the throttles the shared client for a one-round-trip pipeline.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.cache import BaseCache, caches
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient
from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf import routing_settings

__all__ = [
    "AsyncRedis",
    "RedisCache",
    "async_redis",
    "raw_redis",
    "routing_cache",
    "run_script",
    "scripts_loaded",
]

_DJANGO_REDIS = "django.core.cache.backends.redis.RedisCache"


class _SharedClientRedisCacheClient(RedisCacheClient):
    """Django's Redis client wrapper, with one ``redis.Redis`` per pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._clients: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        index = self._get_connection_pool_index(write)  # type: ignore[attr-defined]
        client = self._clients.get(index)
        if client is None:
            with self._lock:
                client = self._clients.get(index)
                if client is None:
                    pool = self._get_connection_pool(write)  # type: ignore[attr-defined]
                    client = self._client(connection_pool=pool)  # type: ignore[attr-defined]
                    self._clients[index] = client
        return client


class RedisCache(DjangoRedisCache):
    """Django's ``RedisCache`` reusing one ``redis.Redis`` client per connection pool
    instead of building one per call. Same settings, same keys, same behaviour."""

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = _SharedClientRedisCacheClient


_lock = threading.Lock()
_shared: dict[str, BaseCache] = {}
_per_thread: set[str] = set()  # aliases whose backend is used through caches[alias]


def _create(alias: str) -> BaseCache:
    params = dict(settings.CACHES[alias])
    backend = params.pop("BACKEND")
    location = params.pop("LOCATION", "")
    if backend == _DJANGO_REDIS:
        return RedisCache(location, params)
    return caches.create_connection(alias)


def routing_cache(alias: str | None = None) -> BaseCache:
    """The process-wide cache object for ``alias`` (default: ``LLM_ROUTING
    ["CACHE_ALIAS"]``); ``caches[alias]`` when its backend may not be shared by threads."""
    alias = alias or routing_settings.CACHE_ALIAS
    cache = _shared.get(alias)
    if cache is not None:
        return cache
    if alias in _per_thread:
        return caches[alias]
    with _lock:
        cache = _shared.get(alias)
        if cache is None:
            cache = _create(alias)
            if not isinstance(cache, DjangoRedisCache | LocMemCache):
                _per_thread.add(alias)  # not known to be thread-safe: Django's per thread
                return caches[alias]
            _shared[alias] = cache
    return cache


def raw_redis(cache: BaseCache) -> Any | None:
    """The shared ``redis.Redis`` client behind ``cache``, or None when it is not
    Django's Redis backend."""
    if not isinstance(cache, DjangoRedisCache):
        return None
    return cache._cache.get_client(None, write=True)


#: Registered Lua scripts by (``"sync"`` | ``"async"``, source). A Script object holds
#: only its source and SHA: each call passes its own client (Django's per-call client,
#: the event loop's ``redis.asyncio`` client).
_scripts: dict[tuple[str, str], Any] = {}


def _script(kind: str, client: Any, source: str) -> Any:
    script = _scripts.get((kind, source))
    if script is None:
        script = _scripts.setdefault((kind, source), client.register_script(source))
    return script


def run_script(client: Any, source: str, keys: list[str], args: list[Any]) -> Any:
    """EVALSHA ``source`` on a redis-py client (loaded on first use, and again after a
    Redis restart: redis-py's Script handles NOSCRIPT)."""
    return _script("sync", client, source)(keys=keys, args=args, client=client)


def scripts_loaded(kind: str) -> set[str]:
    """The sources registered so far for ``"sync"`` or ``"async"`` calls (for tests)."""
    return {source for k, source in _scripts if k == kind}


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting in {"CACHES", "LLM_ROUTING"}:
        with _lock:
            _shared.clear()
            _per_thread.clear()
            _async.clear()


#: Connections of each event loop's redis.asyncio pool (the cache's OPTIONS
#: ``max_connections`` overrides it); more commands in flight wait for one.
ASYNC_POOL_SIZE = 100
#: How long a command waits for a pooled connection when the cache sets no
#: ``socket_timeout``.
ASYNC_POOL_WAIT_S = 1.0
_ASYNC_POOL_OPTIONS = frozenset(
    {"socket_timeout", "socket_connect_timeout", "socket_keepalive", "max_connections"}
)


class AsyncRedis:
    """The routing cache's Redis for code on the event loop: a ``redis.asyncio`` client
    per event loop (an asyncio connection belongs to its loop), with the cache's own
    keys (prefix, version) and serializer, so values are shared with the sync path.
    Django's async cache methods would instead queue every call on one thread
    (``sync_to_async(thread_sensitive=True)``)."""

    def __init__(self, cache: DjangoRedisCache) -> None:
        self._cache = cache
        client = cache._cache  # the backend's RedisCacheClient (one per cache object)
        self._url: str = client._servers[0]  # type: ignore[attr-defined]
        self._serializer = client._serializer  # type: ignore[attr-defined]
        # The cache's socket options (timeouts), as the sync client gets them.
        options = client._pool_options  # type: ignore[attr-defined]
        self._options: dict[str, Any] = {
            k: v for k, v in options.items() if k in _ASYNC_POOL_OPTIONS and v is not None
        }
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def _client(self) -> Any:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            with self._lock:
                client = self._clients.get(loop)
                if client is None:
                    import redis.asyncio  # only with a Redis cache (redis-py is optional)

                    # A blocking pool: past its size a command waits for a connection
                    # (at most the socket timeout) instead of failing at once, which
                    # redis-py's default pool does past 100 commands in flight on the
                    # loop — a loop holding hundreds of requests would put every
                    # circuit on process-local state (tests/test_cache_async_services.py).
                    options = dict(self._options)
                    pool = redis.asyncio.BlockingConnectionPool.from_url(
                        self._url,
                        max_connections=int(options.pop("max_connections", ASYNC_POOL_SIZE)),
                        timeout=float(options.get("socket_timeout") or ASYNC_POOL_WAIT_S),
                        **options,
                    )
                    client = self._clients[loop] = redis.asyncio.Redis(connection_pool=pool)
        return client

    def client(self) -> Any:
        """This event loop's ``redis.asyncio.Redis`` (for a pipeline or a script)."""
        return self._client()

    async def run_script(self, source: str, keys: list[str], args: list[Any]) -> Any:
        """:func:`run_script` through this event loop's client."""
        client = self._client()
        return await _script("async", client, source)(keys=keys, args=args, client=client)

    def _key(self, key: str) -> str:
        return self._cache.make_key(key)  # our own keys: no per-character validation

    async def get(self, key: str, default: Any = None) -> Any:
        raw = await self._client().get(self._key(key))
        return default if raw is None else self._serializer.loads(raw)

    async def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        keys = list(keys)
        if not keys:
            return {}
        raws = await self._client().mget([self._key(k) for k in keys])
        return {
            k: self._serializer.loads(v) for k, v in zip(keys, raws, strict=True) if v is not None
        }

    async def set(self, key: str, value: Any, timeout: float | None) -> None:
        ttl = self._cache.get_backend_timeout(timeout)
        if ttl == 0:
            await self._client().delete(self._key(key))
            return
        await self._client().set(self._key(key), self._serializer.dumps(value), ex=ttl)

    async def add(self, key: str, value: Any, timeout: float | None) -> bool:
        ttl = self._cache.get_backend_timeout(timeout)
        client = self._client()
        if ttl == 0:  # as Django's: added and gone at once
            if added := bool(
                await client.set(self._key(key), self._serializer.dumps(value), nx=True)
            ):
                await client.delete(self._key(key))
            return added
        return bool(
            await client.set(self._key(key), self._serializer.dumps(value), ex=ttl, nx=True)
        )

    async def delete(self, key: str) -> bool:
        return bool(await self._client().delete(self._key(key)))


_async: dict[int, AsyncRedis] = {}


def async_redis(cache: BaseCache) -> AsyncRedis | None:
    """The :class:`AsyncRedis` of ``cache`` (one per cache object), or None when it is
    not Django's Redis backend."""
    if not isinstance(cache, DjangoRedisCache):
        return None
    found = _async.get(id(cache))
    if found is None or found._cache is not cache:
        with _lock:
            found = _async.get(id(cache))
            if found is None or found._cache is not cache:
                found = _async[id(cache)] = AsyncRedis(cache)
    return found
