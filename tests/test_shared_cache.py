"""The app's own Redis clients from public settings (llm_routing.cache.RedisStore), its
serializer, the one cache-down back-off, REDIS_URL's validation and the system check
against a process-local routing cache under several workers (llm_routing.E020)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from django.core.cache.backends.redis import RedisCacheClient
from django.test import override_settings

from llm_routing import cache as routing
from llm_routing.cache import CacheBackoff, JsonSerializer, RedisStore, routing_cache
from llm_routing.checks import check_settings, check_shared_cache, worker_processes

REDIS = "django.core.cache.backends.redis.RedisCache"
LOCMEM = "django.core.cache.backends.locmem.LocMemCache"


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


# --- the store, from public settings only --------------------------------------------------


@pytest.mark.parametrize(
    "private",
    ["_get_connection_pool_index", "_get_connection_pool", "get_client", "get"],
)
def test_the_store_needs_no_private_of_djangos_redis_client(
    monkeypatch: pytest.MonkeyPatch, private: str
) -> None:
    """Built from LOCATION and OPTIONS: a Django whose RedisCacheClient renamed any of
    what the app used to reach into still gets the app its shared Redis (building a
    client opens no connection, so no server is needed here)."""
    monkeypatch.delattr(RedisCacheClient, private)
    caches = {
        "default": {
            "BACKEND": REDIS,
            "LOCATION": "redis://:s3cret@10.0.0.9:6380/3,redis://replica:6379/3",
            "OPTIONS": {"socket_timeout": 1.5, "socket_connect_timeout": 0.5},
            "KEY_PREFIX": "pre",
        }
    }
    with override_settings(CACHES=caches):
        store = routing_cache()
        assert isinstance(store, RedisStore)
        kwargs = store.client.connection_pool.connection_kwargs
        # The first server (the one Django writes to), its db, and the cache's OPTIONS.
        assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("10.0.0.9", 6380, 3)
        assert kwargs["socket_timeout"] == 1.5 and kwargs["socket_connect_timeout"] == 0.5
        assert store.make_key("k") == "pre:1:k"  # the alias's own keys (KEY_PREFIX, VERSION)
        assert routing.raw_redis(store) is store.client
        assert routing.async_redis(store) is store.aio
        assert "s3cret" not in repr(store)
        assert routing_cache() is store  # one per process


def test_redis_url_wins_over_a_local_cache() -> None:
    caches = {"default": {"BACKEND": LOCMEM, "KEY_PREFIX": "x"}}
    with override_settings(CACHES=caches, LLM_ROUTING={"REDIS_URL": "redis://r.internal/5"}):
        store = routing_cache()
        assert isinstance(store, RedisStore)
        kwargs = store.client.connection_pool.connection_kwargs
        assert (kwargs["host"], kwargs["db"]) == ("r.internal", 5)
        assert store.make_key("k") == "x:1:k"
    with override_settings(CACHES=caches):
        assert not isinstance(routing_cache(), RedisStore)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://cache.internal:6379/0", "must start with redis://"),
        ("redis://", "names no host"),
        ("", "non-empty string"),
        (6379, "non-empty string"),
    ],
)
def test_a_bad_redis_url_is_a_settings_error_that_never_echoes_it(url: Any, problem: str) -> None:
    with override_settings(LLM_ROUTING={"REDIS_URL": url}):
        (message,) = [m for m in check_settings() if m.id == "llm_routing.E002"]
    assert problem in message.msg
    if isinstance(url, str) and url:
        assert url not in message.msg


@pytest.mark.parametrize("url", ["redis://:pw@h:6379/1", "rediss://h", "unix:///run/redis.sock"])
def test_a_good_redis_url_passes(url: str) -> None:
    with override_settings(LLM_ROUTING={"REDIS_URL": url}):
        assert "llm_routing.E002" not in ids(check_settings())


def test_the_serializer_is_json_and_reads_counters_and_refuses_pickle() -> None:
    serializer = JsonSerializer()
    record = {"state": "open", "failures": 3, "until": 12.5, "token": None}
    assert serializer.loads(serializer.dumps(record)) == record
    assert serializer.dumps(7) == b"7"  # what INCR writes and reads
    assert serializer.loads(b"42") == 42
    # A value pickled by an earlier release (Django's serializer) reads as absent: never
    # unpickled, so a value in Redis cannot run code here.
    assert serializer.loads(pickle.dumps({"state": "open"})) is None
    assert serializer.loads(None) is None


# --- the one back-off ---------------------------------------------------------------------


def test_the_backoff_skips_the_cache_for_its_interval_and_says_so_once() -> None:
    now = [100.0]
    backoff = CacheBackoff(5.0, clock=lambda: now[0], log_interval_s=60.0)
    assert backoff.open() and not backoff.down
    assert backoff.failed() is True  # the outage starts: log it
    assert backoff.failed() is False  # still the same outage
    assert not backoff.open()
    now[0] += 4.9
    assert not backoff.open()
    now[0] += 0.1
    assert backoff.open()
    assert backoff.should_log() and not backoff.should_log()  # one warning a minute
    now[0] += 60
    assert backoff.should_log()
    assert backoff.answered() is True and backoff.answered() is False
    assert not backoff.down


def test_every_user_of_the_cache_shares_the_back_off_class() -> None:
    from llm_routing import budgets, snapshot
    from llm_routing.api import throttles
    from llm_routing.resilience import breaker

    for backoff in (
        breaker.store.backoff,
        throttles.backoff,
        budgets.backoff,
        snapshot._holder.backoff,
    ):
        assert type(backoff) is CacheBackoff
        assert backoff.retry_s == routing.CACHE_RETRY_S


# --- E020: a process-local cache under several workers --------------------------------------


@pytest.mark.parametrize(
    ("env", "workers"),
    [
        ({"WEB_CONCURRENCY": "4"}, 4),
        ({"GUNICORN_CMD_ARGS": "--bind 0:80 --workers=3"}, 3),
        ({"GUNICORN_CMD_ARGS": "-w 2"}, 2),
        ({}, 1),
        ({"WEB_CONCURRENCY": "1"}, 1),
    ],
)
def test_locmem_under_several_workers_is_an_error(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], workers: int
) -> None:
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    monkeypatch.delenv("GUNICORN_CMD_ARGS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert worker_processes()[0] == workers
    with override_settings(CACHES={"default": {"BACKEND": LOCMEM}}):
        messages = check_shared_cache()
        assert ids(messages) == (["llm_routing.E020"] if workers > 1 else [])
        if messages:
            assert messages[0].is_serious() and f"{workers} worker" in messages[0].msg
        # Shared elsewhere: no error.
        with override_settings(LLM_ROUTING={"REDIS_URL": "redis://r/0"}):
            assert check_shared_cache() == []
    with override_settings(CACHES={"default": {"BACKEND": REDIS, "LOCATION": "redis://r/0"}}):
        assert check_shared_cache() == []
