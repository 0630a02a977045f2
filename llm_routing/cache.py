"""The routing cache: one store per process for the keys this app owns (circuits,
throttle and budget counters, the configuration version key).

Django's ``caches[alias]`` is one cache object per thread (per async context), and its
Redis backend builds a new ``redis.Redis`` client on every call (measured:
docs/production.md, "Caches and their staleness"). The hot path goes through
:func:`routing_cache` instead:

* **Redis** — ``LLM_ROUTING["REDIS_URL"]`` when set, else the cache
  ``LLM_ROUTING["CACHE_ALIAS"]`` when its backend is Django's ``RedisCache``:
  :class:`RedisStore`, the app's own clients built from public settings only (the URL,
  or the cache's first ``LOCATION`` and its ``OPTIONS``, which are redis-py connection-pool
  arguments as for Django). One ``redis.Redis`` per process (redis-py's clients and
  pools are thread-safe) and one ``redis.asyncio`` client per event loop
  (:class:`AsyncRedis`). Values are written with the app's own serializer,
  :data:`SERIALIZER` (JSON: an integer is its decimal digits, so the counters the Lua
  scripts ``INCR`` read back as integers; no pickle, so a value read from Redis never
  runs code). Keys are the cache alias's own (``make_key``: ``KEY_PREFIX``, ``VERSION``,
  ``KEY_FUNCTION``), so a budget's counters written by an earlier release are read on.
* **LocMem** — one Django cache object per process (process memory; see the system
  check ``llm_routing.E020`` for multi-worker deployments).
* **Any other backend** — ``caches[alias]``, Django's per-thread object.

:func:`raw_redis` gives the throttles and budgets the shared sync client for a script
or pipeline, :func:`async_redis` the event loop's. :class:`CacheBackoff` is the one
"the cache failed: leave it alone for a few seconds" policy the breaker, the throttles,
the budgets and the snapshot share.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from urllib.parse import urlsplit

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from .conf import routing_settings

__all__ = [
    "CACHE_RETRY_S",
    "SERIALIZER",
    "AsyncRedis",
    "CacheBackoff",
    "JsonSerializer",
    "RedisCache",
    "RedisStore",
    "SharedStore",
    "async_redis",
    "raw_redis",
    "redis_url_problem",
    "routing_cache",
    "run_script",
    "scripts_loaded",
]

_DJANGO_REDIS = "django.core.cache.backends.redis.RedisCache"
_REDIS_SCHEMES = ("redis", "rediss", "unix")

#: After a cache failure, the app leaves the cache alone for this long (seconds).
CACHE_RETRY_S = 5.0


class CacheBackoff:
    """After a failure, skip the cache for ``retry_s``; say so once per outage.

    The one cache-down policy of the breaker, the throttles, the budgets and the
    snapshot (each keeps its own instance: what it does while the cache is down differs,
    and its own warning says so). ``clock`` is a monotonic clock (a fake one in tests).
    :meth:`failed` returns True for the first failure of an outage (log it),
    :meth:`answered` True for the first success after one (log the recovery)."""

    def __init__(
        self,
        retry_s: float = CACHE_RETRY_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        log_interval_s: float | None = None,
    ) -> None:
        self.retry_s = retry_s
        self.clock = clock
        #: While the cache keeps failing, :meth:`should_log` answers True at most once
        #: per this many seconds (None: once per outage).
        self.log_interval_s = log_interval_s
        self._lock = threading.Lock()
        self.retry_at = 0.0
        self.down = False
        self._next_log_at = 0.0

    def open(self) -> bool:
        """Whether the cache may be tried now (no failure within ``retry_s``)."""
        return self.clock() >= self.retry_at

    def failed(self) -> bool:
        """Record a failure; True when it starts an outage."""
        with self._lock:
            self.retry_at = self.clock() + self.retry_s
            first = not self.down
            self.down = True
        return first

    def answered(self) -> bool:
        """Record a success; True when it ends an outage."""
        if not self.down:
            return False
        with self._lock:
            was_down, self.down = self.down, False
        return was_down

    def should_log(self) -> bool:
        """Whether a warning about the outage is due (see ``log_interval_s``)."""
        if self.log_interval_s is None:
            return True
        now = self.clock()
        with self._lock:
            if now < self._next_log_at:
                return False
            self._next_log_at = now + self.log_interval_s
        return True

    def reset(self) -> None:
        """Forget any failure (tests; an operator who knows the cache is back)."""
        with self._lock:
            self.retry_at = self._next_log_at = 0.0
            self.down = False


class JsonSerializer:
    """The serializer of the keys this app owns: JSON, compact. An integer is its
    decimal digits (what Redis ``INCR`` reads and writes), so script counters and
    values share one format. A value that is not JSON (written by an older release
    with Django's pickle serializer) reads as absent."""

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode("utf-8")

    def loads(self, raw: bytes | str | None) -> Any:
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return None


SERIALIZER = JsonSerializer()


def redis_url_problem(url: object) -> str | None:
    """Why ``url`` is not a usable Redis URL (None: it is). Never echoes the URL (it may
    hold a password)."""
    if not isinstance(url, str) or not url:
        return "REDIS_URL must be a non-empty string"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "REDIS_URL is not a URL"
    if parts.scheme not in _REDIS_SCHEMES:
        return "REDIS_URL must start with redis://, rediss:// or unix://"
    if parts.scheme != "unix" and not parts.hostname:
        return "REDIS_URL names no host"
    return None


def _ttl(timeout: float | None) -> int | None:
    """Seconds to keep a value (Django's Redis backend's rule): None forever, else
    whole seconds, 0 or less meaning "expired at once"."""
    return None if timeout is None else max(0, int(timeout))


class SharedStore(Protocol):
    """What :func:`routing_cache` returns: Django's cache methods the app uses
    (a :class:`RedisStore`, or a Django cache object)."""

    def get(self, key: str, default: Any = None) -> Any: ...
    def get_many(self, keys: Iterable[str]) -> dict[str, Any]: ...
    def set(self, key: str, value: Any, timeout: Any = ...) -> None: ...
    def add(self, key: str, value: Any, timeout: Any = ...) -> bool: ...
    def delete(self, key: str) -> bool: ...
    def make_key(self, key: str) -> str: ...


class RedisStore:
    """The app's own Redis client for its keys (see the module doc): Django's cache
    methods the app uses (``get``, ``get_many``, ``set``, ``add``, ``delete``,
    ``make_key``), the shared ``client`` for scripts and pipelines, and ``aio``, the
    event loop's :class:`AsyncRedis` on the same server."""

    def __init__(
        self,
        url: str,
        options: dict[str, Any],
        make_key: Callable[[str], str],
        serializer: JsonSerializer = SERIALIZER,
    ) -> None:
        import redis  # only with a Redis cache (redis-py is optional)

        options = dict(options)
        options.pop("serializer", None)  # the cache's serializer; the app uses its own
        pool_class = options.pop("pool_class", None) or redis.ConnectionPool
        if isinstance(pool_class, str):
            pool_class = import_string(pool_class)
        parser_class = options.pop("parser_class", None)
        if isinstance(parser_class, str):
            options["parser_class"] = import_string(parser_class)
        elif parser_class is not None:
            options["parser_class"] = parser_class
        self.url = url
        self.options = options
        self.make_key = make_key
        self.serializer = serializer
        self.client = redis.Redis(connection_pool=pool_class.from_url(url, **options))
        self.aio = AsyncRedis(self)

    def __repr__(self) -> str:  # never the URL: it may hold a password
        return "<RedisStore>"

    def get(self, key: str, default: Any = None) -> Any:
        raw = self.client.get(self.make_key(key))
        value = self.serializer.loads(raw)
        return default if value is None else value

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        keys = list(keys)
        if not keys:
            return {}
        raws = self.client.mget([self.make_key(k) for k in keys])
        loaded = {k: self.serializer.loads(v) for k, v in zip(keys, raws, strict=True)}
        return {k: v for k, v in loaded.items() if v is not None}

    def set(self, key: str, value: Any, timeout: float | None = None) -> None:
        ttl = _ttl(timeout)
        if ttl == 0:
            self.client.delete(self.make_key(key))
            return
        self.client.set(self.make_key(key), self.serializer.dumps(value), ex=ttl)

    def add(self, key: str, value: Any, timeout: float | None = None) -> bool:
        ttl = _ttl(timeout)
        name = self.make_key(key)
        if ttl == 0:  # as Django's: added and gone at once
            if added := bool(self.client.set(name, self.serializer.dumps(value), nx=True)):
                self.client.delete(name)
            return added
        return bool(self.client.set(name, self.serializer.dumps(value), ex=ttl, nx=True))

    def delete(self, key: str) -> bool:
        return bool(self.client.delete(self.make_key(key)))


class RedisCache(DjangoRedisCache):
    """Django's ``RedisCache``, unchanged. Kept so settings that name
    ``llm_routing.cache.RedisCache`` keep working; the app's own keys no longer go
    through any cache backend's client (:class:`RedisStore`)."""


_lock = threading.Lock()
_shared: dict[str, Any] = {}
_per_thread: set[str] = set()  # aliases whose backend is used through caches[alias]


def _redis_source(alias: str) -> tuple[str, dict[str, Any]] | None:
    """(URL, pool options) of the Redis this app's keys live in, from public settings:
    ``LLM_ROUTING["REDIS_URL"]``, else the alias's ``LOCATION`` (its first server: the
    one Django writes to) and ``OPTIONS`` when its backend is Django's Redis."""
    url = routing_settings.REDIS_URL
    params = settings.CACHES.get(alias, {})
    options = dict(params.get("OPTIONS") or {})
    if url:
        problem = redis_url_problem(url)
        if problem:
            raise ImproperlyConfigured(f"LLM_ROUTING: {problem}.")
        is_redis = params.get("BACKEND") == _DJANGO_REDIS
        return url, options if is_redis else {}
    if params.get("BACKEND") != _DJANGO_REDIS:
        return None
    location = params.get("LOCATION", "")
    servers = location if isinstance(location, list | tuple) else re.split("[;,]", location)
    return str(servers[0]).strip(), options


def _create(alias: str) -> Any:
    source = _redis_source(alias)
    if source is not None:
        url, options = source
        return RedisStore(url, options, caches.create_connection(alias).make_key)
    return caches.create_connection(alias)


def routing_cache(alias: str | None = None) -> Any:
    """The process-wide store for ``alias`` (default: ``LLM_ROUTING["CACHE_ALIAS"]``):
    a :class:`RedisStore`, a process-wide LocMem cache, or ``caches[alias]`` for any
    other backend (see the module doc)."""
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
            if not isinstance(cache, RedisStore | LocMemCache):
                _per_thread.add(alias)  # not known to be thread-safe: Django's per thread
                return caches[alias]
            _shared[alias] = cache
    return cache


def raw_redis(cache: Any) -> Any | None:
    """The shared ``redis.Redis`` client of ``cache``, or None when it is not Redis."""
    return cache.client if isinstance(cache, RedisStore) else None


#: Registered Lua scripts by (``"sync"`` | ``"async"``, source). A Script object holds
#: only its source and SHA: each call passes its own client (Django's per-call client,
#: the event loop's ``redis.asyncio`` client).
_scripts: dict[tuple[str, str], Any] = {}


def _script(kind: str, client: Any, source: str) -> Any:
    script = _scripts.get((kind, source))
    if script is None:
        script = client.register_script(source)
        # Every call passes its own client: the Script must not keep the one it was
        # registered with (an event loop's redis.asyncio client holds that loop, its
        # pool and its sockets).
        script.registered_client = None
        script = _scripts.setdefault((kind, source), script)
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


#: Connections of each event loop's redis.asyncio pool (the cache's OPTIONS
#: ``max_connections`` overrides it); more commands in flight wait for one.
ASYNC_POOL_SIZE = 100
#: How long a command waits for a pooled connection when the cache sets no
#: ``socket_timeout``.
ASYNC_POOL_WAIT_S = 1.0
_ASYNC_POOL_OPTIONS = frozenset(
    {"socket_timeout", "socket_connect_timeout", "socket_keepalive", "max_connections"}
)


#: A reference to an event loop that does not keep it alive (None once it is gone).
LoopRef = Callable[[], "asyncio.AbstractEventLoop | None"]


def loop_ref(loop: asyncio.AbstractEventLoop) -> LoopRef:
    """A weak reference to ``loop``, for a client kept per loop (here and the adapters'
    HTTP clients) that must be let go with its loop."""
    try:
        return weakref.ref(loop)
    except TypeError:  # a loop type without weak references: held until it is closed
        return lambda: loop


class AsyncRedis:
    """The routing store's Redis for code on the event loop: a ``redis.asyncio`` client
    per event loop (an asyncio connection belongs to its loop; a closed loop's client is
    let go), with the store's keys and serializer, so values are shared with the sync
    path. Django's async cache
    methods would instead queue every call on one thread
    (``sync_to_async(thread_sensitive=True)``)."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._url = store.url
        self._serializer = store.serializer
        # The store's socket options (timeouts), as the sync client gets them.
        self._options: dict[str, Any] = {
            k: v for k, v in store.options.items() if k in _ASYNC_POOL_OPTIONS and v is not None
        }
        # By the loop's id, with a weak reference that tells a live loop from a later
        # one given the same id. Not a WeakKeyDictionary: a client's connections hold
        # their loop, so its key would never die and every loop that ever used the
        # cache (each ``asyncio.run()``, each ``async_to_sync`` call) kept its client,
        # pool and sockets for the life of the process.
        self._clients: dict[int, tuple[LoopRef, Any]] = {}
        self._lock = threading.Lock()

    def _client(self) -> Any:
        loop = asyncio.get_running_loop()
        held = self._clients.get(id(loop))
        if held is not None and held[0]() is loop:
            return held[1]
        with self._lock:
            held = self._clients.get(id(loop))
            if held is not None and held[0]() is loop:
                return held[1]
            self._let_go_of_closed_loops()
            import redis.asyncio  # only with a Redis cache (redis-py is optional)

            # A blocking pool: past its size a command waits for a connection (at most
            # the socket timeout) instead of failing at once, which redis-py's default
            # pool does past 100 commands in flight on the loop — a loop holding
            # hundreds of requests would put every circuit on process-local state
            # (tests/test_cache_async_services.py).
            options = dict(self._options)
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                self._url,
                max_connections=int(options.pop("max_connections", ASYNC_POOL_SIZE)),
                timeout=float(options.get("socket_timeout") or ASYNC_POOL_WAIT_S),
                **options,
            )
            client = redis.asyncio.Redis(connection_pool=pool)
            self._clients[id(loop)] = (loop_ref(loop), client)
        return client

    def _let_go_of_closed_loops(self) -> None:
        """Drop the clients of event loops that have closed or are gone (under
        ``_lock``). Their connections cannot be closed from another loop (closing an
        asyncio transport schedules on its own loop); dropped, they are closed by the
        garbage collector with their transports. A process thus holds one client per
        open loop, plus at most the clients of loops closed since a new loop last
        asked for one."""
        for key, (ref, _) in list(self._clients.items()):
            owner = ref()
            if owner is None or owner.is_closed():
                del self._clients[key]

    def loops(self) -> int:
        """How many event loops hold a client now (for tests and diagnostics)."""
        return len(self._clients)

    def client(self) -> Any:
        """This event loop's ``redis.asyncio.Redis`` (for a pipeline or a script)."""
        return self._client()

    async def run_script(self, source: str, keys: list[str], args: list[Any]) -> Any:
        """:func:`run_script` through this event loop's client."""
        client = self._client()
        return await _script("async", client, source)(keys=keys, args=args, client=client)

    def _key(self, key: str) -> str:
        return self._store.make_key(key)

    async def get(self, key: str, default: Any = None) -> Any:
        value = self._serializer.loads(await self._client().get(self._key(key)))
        return default if value is None else value

    async def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        keys = list(keys)
        if not keys:
            return {}
        raws = await self._client().mget([self._key(k) for k in keys])
        loaded = {k: self._serializer.loads(v) for k, v in zip(keys, raws, strict=True)}
        return {k: v for k, v in loaded.items() if v is not None}

    async def set(self, key: str, value: Any, timeout: float | None) -> None:
        ttl = _ttl(timeout)
        if ttl == 0:
            await self._client().delete(self._key(key))
            return
        await self._client().set(self._key(key), self._serializer.dumps(value), ex=ttl)

    async def add(self, key: str, value: Any, timeout: float | None) -> bool:
        ttl = _ttl(timeout)
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


def async_redis(cache: Any) -> AsyncRedis | None:
    """The :class:`AsyncRedis` of ``cache``, or None when it is not Redis."""
    return cache.aio if isinstance(cache, RedisStore) else None


async def acall(cache: Any, method: str, *args: object) -> Any:
    """``cache.<method>(*args)`` from the event loop, never blocking it: LocMem
    (process memory) inline, Redis through ``redis.asyncio`` on this loop (Django's own
    async Redis methods are sync_to_async wrappers that queue every call on one
    thread), any other backend through its async method (``aget``, ``aset``, ...)."""
    if isinstance(cache, LocMemCache):
        return getattr(cache, method)(*args)
    aio = async_redis(cache)
    call = getattr(cache, "a" + method) if aio is None else getattr(aio, method)
    return await call(*args)
