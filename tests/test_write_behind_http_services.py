"""The decision-row invariant over real HTTP (issue 14): ``gunicorn -c gunicorn.conf.py``
as shipped (uvicorn workers, ASGI, 2 workers) with the demo project's production
settings — PostgreSQL, Redis, ``LLM_ROUTING_RECORD_MODE=write_behind`` — answers 240
concurrent ``POST /v1/chat/completions`` (non-stream and stream) against the fake
upstream; after a graceful stop (SIGTERM, which flushes the write-behind queues) every
request id the clients were answered with (``X-Request-ID``) has its RoutingDecision
row and its attempt, and nothing went to the spool.

The router-level twin is tests/test_router_async_services.py (500 concurrent
``aroute`` calls in one process).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from llm_routing.models import Attempt, Chain, ChainEntry, Provider, RoutingDecision
from tests.conftest import upstream_fields
from tests.fakes.upstream import FakeUpstream, Faults

from .support import database_url as _database_url
from .support import free_port as _free_port

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("LLMR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PLAIN = 180  # non-stream requests
STREAMS = 60  # streamed requests
DELAY_S = 0.3  # the upstream's delay: the requests are in flight together
KEY = "sk-http-invariant-123456"


def _start_gunicorn(port: int, spool: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG"}}
    env.update(
        DJANGO_SETTINGS_MODULE="project.settings",  # the production settings of the demo
        DEBUG="false",
        SECRET_KEY=secrets.token_urlsafe(48),
        DATABASE_URL=_database_url(),  # the test database of this session
        REDIS_URL=REDIS_URL,
        TEST_PROVIDER_KEY=KEY,
        GUNICORN_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY="2",
        GUNICORN_ACCESSLOG="",
        LLM_ROUTING_USER_RATE="1000000/min",
        LLM_ROUTING_RECORD_MODE="write_behind",
        LLM_ROUTING_SPOOL_DIR=str(spool),
        PYTHONUNBUFFERED="1",
    )
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_up(proc: subprocess.Popen[bytes], base: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            httpx.get(base + "/health/", timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("gunicorn did not answer within 60 s")


async def _one(client: httpx.AsyncClient, url: str, token: str, stream: bool) -> dict[str, Any]:
    body = {
        "model": "main",
        "stream": stream,
        "messages": [{"role": "user", "content": "Summarize: revenue rose 4%."}],
    }
    headers = {"Authorization": f"Bearer {token}"}
    if not stream:
        response = await client.post(url, json=body, headers=headers)
        return {
            "status": response.status_code,
            "id": response.headers.get("X-Request-ID"),
            "done": response.status_code == 200 and bool(response.json()["choices"]),
        }
    async with client.stream("POST", url, json=body, headers=headers) as response:
        text = [line async for line in response.aiter_lines()]
        return {
            "status": response.status_code,
            "id": response.headers.get("X-Request-ID"),
            "done": "data: [DONE]" in text,
        }


async def _burst(url: str, token: str) -> tuple[list[dict[str, Any]], float]:
    limits = httpx.Limits(max_connections=PLAIN + STREAMS)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        started = time.monotonic()
        kinds = [False] * PLAIN + [True] * STREAMS
        answers = await asyncio.gather(*(_one(client, url, token, s) for s in kinds))
        return list(answers), time.monotonic() - started


def test_every_request_id_answered_over_http_has_its_decision_row(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    row = Provider.objects.create(
        **{**upstream_fields("oc", "openai_compatible", fake_upstream), "max_retries": 0}
    )
    chain = Chain.objects.create(name="main", is_default=True)
    ChainEntry.objects.create(chain=chain, provider=row, position=0)
    user = get_user_model().objects.create_user("http-invariant", password="pw-http-123")
    token = Token.objects.create(user=user).key
    # Every request waits DELAY_S upstream, then gets the healthy answer (streamed when
    # asked).
    fake_upstream.script("openai", *[Faults.slow(DELAY_S)] * (PLAIN + STREAMS))
    port = _free_port()
    spool = tmp_path / "spool"
    log = tmp_path / "gunicorn.log"
    proc = _start_gunicorn(port, spool, log)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_up(proc, base, log)
        answers, took = asyncio.run(_burst(base + "/v1/chat/completions", token))
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)  # the master: a graceful stop of its workers
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    server_log = log.read_text(errors="replace")[-3000:]
    assert code == 0, server_log
    assert [a for a in answers if a["status"] != 200 or not a["done"]] == [], server_log
    ids = [a["id"] for a in answers]
    assert None not in ids and len(set(ids)) == PLAIN + STREAMS
    found = set(
        str(i)
        for i in RoutingDecision.objects.filter(request_id__in=ids).values_list(
            "request_id", flat=True
        )
    )
    assert set(ids) - found == set(), server_log
    assert Attempt.objects.filter(decision__request_id__in=ids, outcome="ok").count() == len(ids)
    assert not spool.exists() or not any(spool.iterdir())  # nothing fell back to the spool
    # In flight together, not one after another (a bound on concurrency, not a timing
    # target): far below PLAIN x the upstream's delay.
    assert took < PLAIN * DELAY_S / 4
