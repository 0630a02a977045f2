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


@pytest.fixture
def own_redis() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.02)
    else:
        proc.kill()
        pytest.fail("the throwaway redis-server did not start")
    try:
        yield proc, url
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _audit(api):
    body = {"task": "t", "input_text": "hi"}
    return api.post("/audit/", data=json.dumps(body), content_type="application/json")


def _chat(api):
    body = {"model": "mock", "messages": [{"role": "user", "content": "hi"}]}
    return api.post("/v1/chat/completions", data=json.dumps(body), content_type="application/json")


def test_killed_redis_gives_no_5xx_anywhere(api, own_redis, monkeypatch, caplog):
    proc, url = own_redis
    monkeypatch.setattr(breaker, "store", CircuitStore())
    monkeypatch.setattr(throttles, "_next_log_at", 0.0, raising=False)
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

        proc.kill()
        proc.wait(timeout=10)

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


def test_throttle_fails_open_only_on_cache_errors(api, monkeypatch):
    # The policy is not "never throttle": a working cache still refuses the excess.
    with override_settings(LLM_ROUTING={"API_THROTTLE_RATES": {"user": "2/min"}}):
        assert [_audit(api).status_code for _ in range(3)] == [200, 200, 429]
