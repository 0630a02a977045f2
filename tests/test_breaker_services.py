"""Circuits shared across processes through the real Redis (services suite).

* process A opens a circuit → process B sends zero requests to that provider;
* 50 concurrent callers (2 processes x 25 threads) in half-open → exactly one probe;
* Redis stopped mid-run (a throwaway redis-server, never the shared one) → every
  request is still served, the failure is logged once.

``LLMR_TEST_REDIS_URL`` (else ``REDIS_URL``, else redis://127.0.0.1:6379/4) names the
shared Redis; each test uses its own key prefix.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings

from llm_routing.models import Chain, ChainEntry, Provider
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import CLOSED, HALF_OPEN, OPEN, CircuitStore
from llm_routing.router import route
from llm_routing.types import AuditRequest, ErrorInfo, ProviderConfig, ProviderResult

from .breaker_support import KIND, FakeUpstream, install

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = (
    os.environ.get("LLMR_TEST_REDIS_URL")
    or os.environ.get("REDIS_URL")
    or "redis://127.0.0.1:6379/4"
)
REQUEST = AuditRequest(task="summarize", input_text="hello")


def shared_caches(prefix: str, location: str = REDIS_URL) -> dict[str, Any]:
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "circuits": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": location,
            "KEY_PREFIX": prefix,
            "OPTIONS": {"socket_connect_timeout": 1.0, "socket_timeout": 1.0},
        },
    }


@pytest.fixture
def prefix() -> str:
    return f"llmr-test-{uuid.uuid4().hex}"


def worker_config(tmp_path: Path, name: str, prefix: str, upstream: str, **extra: Any) -> dict:
    routing = {"CACHE_ALIAS": "circuits", **extra.pop("routing", {})}
    return {
        "db": str(tmp_path / f"{name}.sqlite3"),
        "caches": shared_caches(prefix),
        "routing": routing,
        "providers": [
            {
                "name": "primary",
                "model": "m1",
                "base_url": upstream,
                "max_retries": 2,
                "timeout_s": 60.0,
            }
        ],
        **extra,
    }


def start_worker(config: dict) -> subprocess.Popen[str]:
    """The worker's stderr (its log) goes to a file beside its database."""
    env = dict(os.environ)
    env.pop("CACHE_URL", None)
    with open(config["db"] + ".log", "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.breaker_worker", json.dumps(config)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )


def finish(proc: subprocess.Popen[str], config: dict) -> None:
    proc.wait(timeout=120)
    assert proc.returncode == 0, Path(config["db"] + ".log").read_text()[-2000:]


def run_worker(config: dict) -> list[dict]:
    proc = start_worker(config)
    out, _ = proc.communicate(timeout=120)
    finish(proc, config)
    return [json.loads(line) for line in out.splitlines()]


def test_a_circuit_opened_by_process_a_stops_process_b(tmp_path: Path, prefix: str) -> None:
    long_open = {"BREAKER_COOLDOWNS_S": [300.0], "BREAKER_COOLDOWN_MAX_S": 300.0}
    with FakeUpstream(status=503) as dead:
        a = run_worker(
            worker_config(tmp_path, "a", prefix, dead.url, routing=long_open, requests=3)
        )
        assert [r["provider"] for r in a] == ["mock"] * 3
        assert dead.requests == 9  # 3 requests x (1 + 2 retries), then the circuit opened
        b = run_worker(
            worker_config(
                tmp_path, "b", prefix, dead.url, routing=long_open, requests=20, threads=4
            )
        )
        assert dead.requests == 9  # process B sent nothing
    assert len(b) == 20
    for r in b:
        assert r["skipped"] == [{"provider": "primary", "reason": "circuit_open"}]
        assert r["attempted"] == ["mock"] and r["status"] == "ok"
    with override_settings(CACHES=shared_caches(prefix), LLM_ROUTING={"CACHE_ALIAS": "circuits"}):
        assert CircuitStore().load("primary", "m1").phase(time.time()) == OPEN


def _read_lines(proc: subprocess.Popen[str], sink: queue.Queue[dict]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        sink.put(json.loads(line))


def test_fifty_concurrent_callers_in_half_open_send_exactly_one_probe(
    tmp_path: Path, prefix: str
) -> None:
    routing = {"CACHE_ALIAS": "circuits"}
    with override_settings(CACHES=shared_caches(prefix), LLM_ROUTING=routing):
        # Open the circuit 100 s ago (1 s cooldown): it is half-open now, in Redis.
        past = CircuitStore(clock=lambda: time.time() - 100.0)
        config = ProviderConfig(name="primary", kind=KIND, model="m1", timeout_s=60.0)
        failed = ProviderResult(
            provider="primary",
            model="m1",
            mode="error",
            status="error",
            error=ErrorInfo(category="unavailable", message="", transient=True),
            upstream_requests=1,
        )
        for _ in range(3):
            past.observe(config, failed)
        assert CircuitStore().load("primary", "m1").phase(time.time()) == HALF_OPEN

    results: queue.Queue[dict] = queue.Queue()
    with FakeUpstream(status=200) as upstream:
        upstream.release.clear()  # hold the probe until every other caller has finished
        configs = [
            worker_config(tmp_path, name, prefix, upstream.url, requests=25, threads=25)
            for name in ("a", "b")
        ]
        procs = [start_worker(c) for c in configs]
        readers = [
            threading.Thread(target=_read_lines, args=(p, results), daemon=True) for p in procs
        ]
        for r in readers:
            r.start()
        done: list[dict] = []
        # Wait for 49 answers (or 20 s without a new one after the first: a held
        # second probe would never answer).
        deadline = time.monotonic() + 90
        idle = 0
        while len(done) < 49 and time.monotonic() < deadline and idle < 20:
            try:
                done.append(results.get(timeout=1))
                idle = 0
            except queue.Empty:
                idle += 1 if done else 0
                if all(p.poll() is not None for p in procs):
                    break
        upstream.release.set()
        for r in readers:
            r.join(timeout=90)
        for p, c in zip(procs, configs, strict=True):
            finish(p, c)
        while not results.empty():
            done.append(results.get())
        assert upstream.requests == 1
    assert len(done) == 50
    served_by_primary = [r for r in done if r["provider"] == "primary"]
    assert len(served_by_primary) == 1
    skipped = [r for r in done if r["provider"] == "mock"]
    assert len(skipped) == 49
    assert all(r["skipped"] == [{"provider": "primary", "reason": "circuit_open"}] for r in skipped)
    with override_settings(CACHES=shared_caches(prefix), LLM_ROUTING=routing):
        assert CircuitStore().load("primary", "m1").phase(time.time()) == CLOSED


# --- Redis stopped mid-run ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (needed by the services suite)")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("the throwaway redis-server did not start")
            time.sleep(0.05)
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@pytest.mark.django_db
def test_requests_are_served_when_redis_stops_mid_run(
    throwaway_redis: tuple[subprocess.Popen[bytes], int],
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proc, port = throwaway_redis
    install()
    monkeypatch.setattr(breaker, "store", CircuitStore())
    caplog.set_level(logging.INFO, logger="llm_routing.breaker")
    routing = {
        "CACHE_ALIAS": "circuits",
        "BREAKER_COOLDOWNS_S": [300.0],
        "BREAKER_COOLDOWN_MAX_S": 300.0,
    }
    with (
        FakeUpstream(status=503) as dead,
        FakeUpstream(status=200) as healthy,
        override_settings(
            CACHES=shared_caches(prefix, f"redis://127.0.0.1:{port}/0"), LLM_ROUTING=routing
        ),
    ):
        primary = Provider.objects.create(
            name="primary", kind=KIND, model="m1", base_url=dead.url, max_retries=0
        )
        backup = Provider.objects.create(name="backup", kind=KIND, model="b1", base_url=healthy.url)
        chain = Chain.objects.create(name="main", is_default=True)
        ChainEntry.objects.create(chain=chain, provider=primary, position=0)
        ChainEntry.objects.create(chain=chain, provider=backup, position=1)

        for _ in range(3):
            assert route(REQUEST).result.provider == "backup"
        assert dead.requests == 3
        routed = route(REQUEST)
        assert routed.metadata.skipped_providers == [
            {"provider": "primary", "reason": "circuit_open"}
        ]
        assert caches["circuits"].get_many(["x"]) == {}  # Redis answers …
        assert not breaker.store.degraded

        proc.kill()  # … and now it is gone
        proc.wait(timeout=10)

        for _ in range(20):
            routed = route(REQUEST)
            assert routed.result.status == "ok"
            assert routed.result.provider == "backup"
        assert breaker.store.degraded
        # Process-local state starts closed and re-opens after the threshold.
        assert dead.requests <= 3 + 3
    warnings = [r for r in caplog.records if "Circuit cache" in r.getMessage()]
    assert len(warnings) == 1
