"""Issue 11 (part A, item 3): a Redis outage is not an API outage.

A throwaway ``redis-server`` (started here on a free port, never the shared one) is the
Django cache; it is killed mid-run and every endpoint keeps answering: throttles fail
open (one warning per interval), circuits go process-local, ``/health/`` says
``degraded``.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis
from django.test import override_settings

from llm_routing.api import throttles
from llm_routing.cache import CacheBackoff
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import CircuitStore

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnRedis:
    """A throwaway redis-server on a free port, which the test may kill and restart."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        try:
            for _ in range(250):
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    time.sleep(0.02)
            pytest.fail("the throwaway redis-server did not start")
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        server.kill()


def _audit(api):
    body = {"task": "t", "input_text": "hi"}
    return api.post("/audit/", data=json.dumps(body), content_type="application/json")


def _chat(api):
    body = {"model": "mock", "messages": [{"role": "user", "content": "hi"}]}
    return api.post("/v1/chat/completions", data=json.dumps(body), content_type="application/json")


def test_killed_redis_gives_no_5xx_anywhere(api, own_redis, monkeypatch, caplog):
    url = own_redis.url
    monkeypatch.setattr(breaker, "store", CircuitStore())
    monkeypatch.setattr(throttles, "backoff", CacheBackoff(log_interval_s=60.0))
    backend = "django.core.cache.backends.redis.RedisCache"
    caches = {"default": {"BACKEND": backend, "LOCATION": url, "KEY_PREFIX": "outage"}}
    limits = {"API_THROTTLE_RATES": {"user": "4/min", "anon": "4/min"}}
    with override_settings(CACHES=caches, LLM_ROUTING=limits):
        # Cache up: the throttle works (4 allowed, the 5th refused) and health is ok.
        statuses = [_audit(api).status_code for _ in range(3)]
        health = api.get("/health/")
        assert statuses == [200, 200, 200] and health.status_code == 200
        assert health.json()["cache"] == "ok" and health.json()["status"] == "ok"
        assert _chat(api).status_code == 429

        own_redis.kill()

        caplog.set_level(logging.WARNING, logger="llm_routing")
        answered = []
        for _ in range(4):
            answered += [_audit(api).status_code, _chat(api).status_code]
            answered.append(api.get("/health/").status_code)
        # Fail open: well past the 4/min rate, and never a 5xx.
        assert answered == [200] * 12
        health = api.get("/health/").json()
        assert health["status"] == "degraded" and health["cache"] == "degraded"
        throttle_warnings = [
            r for r in caplog.records if r.name == "llm_routing.api" and "Throttle" in r.message
        ]
        assert len(throttle_warnings) == 1
        assert url not in caplog.text

        # The cache is back (an empty one): once the retry intervals have passed,
        # throttling resumes and /health/ is ok again.
        own_redis.start()
        throttles.backoff.retry_at = 0.0  # the retry intervals have passed
        breaker.store.backoff.retry_at = 0.0
        health = api.get("/health/").json()  # the 1st of 4 requests allowed this minute
        assert health["status"] == "ok" and health["cache"] == "ok"
        assert [_audit(api).status_code for _ in range(4)] == [200, 200, 200, 429]


def test_throttle_fails_open_only_on_cache_errors(api, monkeypatch):
    # The policy is not "never throttle": a working cache still refuses the excess.
    with override_settings(LLM_ROUTING={"API_THROTTLE_RATES": {"user": "2/min"}}):
        assert [_audit(api).status_code for _ in range(3)] == [200, 200, 429]
