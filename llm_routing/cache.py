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

import threading
from typing import Any

from django.conf import settings
from django.core.cache import BaseCache, caches
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient
from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf import routing_settings

__all__ = ["RedisCache", "raw_redis", "routing_cache"]

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


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting in {"CACHES", "LLM_ROUTING"}:
        with _lock:
            _shared.clear()
            _per_thread.clear()
