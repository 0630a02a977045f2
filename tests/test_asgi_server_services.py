"""The shipped ASGI server, started the way production and CI start it —
``gunicorn -c gunicorn.conf.py`` with its default worker class (uvicorn workers serving
``project.asgi:application``), two workers — on PostgreSQL and Redis (services suite):

* a configuration change made in another process (this one) is live on every worker
  within 1 s (the staleness bound of docs/production.md, "Caches and their staleness");
* the decision-row invariant under 500 concurrent requests through the server: every
  answered request id has its decision row;
* a client leaving mid-stream closes the upstream request, for every vendor kind.

Which worker served an upstream request is read from the socket it came from: the fake
upstream records each request's client port, and /proc says which worker owns it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token

from llm_routing.models import Chain, ChainEntry, Provider, RoutingDecision

from .conftest import VENDOR_OF_KIND, upstream_fields
from .fakes.upstream import FakeUpstream, Faults
from .support import ROOT, chat_words, clean_env
from .support import database_url as _database_url

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

KEY = "sk-asgi-server-123456"
CHAT = {"model": "default", "messages": [{"role": "user", "content": "Say hello."}]}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _children(parent: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid …: comm may hold spaces, so split after its ")".
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            pids.append(int(entry.name))
    return sorted(pids)


def _socket_owners(pids: list[int], peer_port: int) -> dict[int, int]:
    """Local port → pid, for the TCP sockets of ``pids`` connected to ``peer_port``."""
    inode_pid: dict[str, int] = {}
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            fds = list(fd_dir.iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inode_pid[target[len("socket:[") : -1]] = pid
    owners: dict[int, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if int(remote.rsplit(":", 1)[1], 16) == peer_port and inode in inode_pid:
                owners[int(local.rsplit(":", 1)[1], 16)] = inode_pid[inode]
    return owners


@dataclass
class Server:
    base: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def workers(self) -> list[int]:
        return _children(self.proc.pid)

    def stop(self) -> None:
        """A graceful stop (SIGTERM), as a deploy does: the workers flush what they hold."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture
def record_mode() -> str:
    """How the server records decisions (a test parametrizes it)."""
    return "inline"


@pytest.fixture
def shipped_server(
    tmp_path: Path, fake_upstream: FakeUpstream, record_mode: str
) -> Iterator[Server]:
    """``gunicorn -c gunicorn.conf.py`` as shipped (no worker class given: uvicorn
    workers), two workers, on this test's database and the suite's Redis prefix."""
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    if connection.vendor != "postgresql" or not isinstance(caches["default"], RedisCache):
        pytest.fail("Run on the services: `python3 dev.py test --services`.")
    cache = settings.CACHES["default"]
    port = _free_port()
    env = clean_env(
        DJANGO_SETTINGS_MODULE="tests.settings_services",
        LLMR_TEST_DATABASE_URL=_database_url(),
        LLMR_TEST_REDIS_URL=str(cache["LOCATION"]),
        LLMR_TEST_CACHE_PREFIX=str(cache["KEY_PREFIX"]),
        LLMR_TEST_NO_THROTTLES="1",  # bursts from one token: only the routing is under test
        TEST_PROVIDER_KEY=KEY,
        LLMR_TEST_RECORD_MODE=record_mode,
        LLMR_TEST_SPOOL_DIR=str(tmp_path / "spool"),
        GUNICORN_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY="2",
        GUNICORN_ACCESSLOG="",
        PYTHONUNBUFFERED="1",
    )
    assert "GUNICORN_WORKER_CLASS" not in env  # the shipped default: ASGI
    log_path = tmp_path / "web.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-4000:]
            try:
                answer = httpx.get(server.base + "/health/", timeout=2)
                if answer.status_code == 401 and len(server.workers) == 2:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "gunicorn did not answer within 60 s"
            time.sleep(0.2)
        assert answer.headers["server"] == "uvicorn"  # the ASGI face, not gthread
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def token() -> str:
    user = get_user_model().objects.create_user("server", password="pw-server-123")
    return str(Token.objects.create(user=user).key)


def _chain(fake: FakeUpstream, *names: str) -> list[Provider]:
    chain = Chain.objects.create(name="default", is_default=True)
    rows = []
    for position, name in enumerate(names):
        fields = upstream_fields(name, "openai_compatible", fake)
        row = Provider.objects.create(**{**fields, "model": f"{name}-model", "max_retries": 0})
        ChainEntry.objects.create(chain=chain, provider=row, position=position)
        rows.append(row)
    return rows


class Workers:
    """Which worker asked the fake upstream for what: each request's client port, mapped
    to the worker owning that socket while it is open (mapped after every burst)."""

    def __init__(self, server: Server, fake: FakeUpstream) -> None:
        self.server, self.fake = server, fake
        self.owners: dict[int, int] = {}

    def look(self) -> None:
        port = int(self.fake.url.rsplit(":", 1)[1])
        self.owners.update(_socket_owners(self.server.workers, port))

    def models(self, since: int) -> dict[int, set[str]]:
        """Worker pid → the models it asked for, in the fake's requests[since:]."""
        served: dict[int, set[str]] = {}
        for request in self.fake.requests[since:]:
            if request.client is not None and request.client[1] in self.owners:
                pid = self.owners[request.client[1]]
                served.setdefault(pid, set()).add(request.json["model"])
        return served


@dataclass(frozen=True)
class Answer:
    sent_at: float  # seconds after the change committed (negative: before)
    status: int
    provider: str


def _client(server: Server) -> httpx.AsyncClient:
    # No keep-alive: every request is a new connection, for either worker to accept.
    limits = httpx.Limits(max_keepalive_connections=0)
    return httpx.AsyncClient(base_url=server.base, timeout=30, limits=limits)


async def _burst(client: httpx.AsyncClient, token: str, n: int, since: float) -> list[Answer]:
    async def one() -> Answer:
        sent_at = time.monotonic() - since
        response = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {token}"}
        )
        return Answer(sent_at, response.status_code, response.headers.get("X-LLM-Provider", ""))

    return list(await asyncio.gather(*(one() for _ in range(n))))


def test_a_config_change_is_live_on_both_workers_within_a_second(
    shipped_server: Server, fake_upstream: FakeUpstream, token: str
) -> None:
    """Both workers serve ``a`` (their snapshots built); ``a`` is disabled here (another
    process: the save's signal bumps the version key in Redis on commit). Every request
    sent 1 s or more after the commit is served by ``b``, and both workers served such
    requests. When the last stale answer came is printed, not asserted (a timing)."""
    a, _b = _chain(fake_upstream, "a", "b")
    workers = Workers(shipped_server, fake_upstream)
    both = set(shipped_server.workers)

    async def warm() -> list[Answer]:
        answers: list[Answer] = []
        async with _client(shipped_server) as client:
            deadline = time.monotonic() + 20
            while set(workers.models(0)) != both:
                assert time.monotonic() < deadline, f"one worker served all: {workers.models(0)}"
                answers += await _burst(client, token, 8, time.monotonic())
                workers.look()
        return answers

    warmed = asyncio.run(warm())
    assert {(w.status, w.provider) for w in warmed} == {(200, "a")}
    assert all(models == {"a-model"} for models in workers.models(0).values())

    a.enabled = False
    a.save()  # autocommit: the version key is bumped as the row commits
    committed = time.monotonic()
    late_from: list[int] = []  # the fake's request index when the 1 s bound had passed

    async def poll() -> list[Answer]:
        answers: list[Answer] = []
        async with _client(shipped_server) as client:
            while True:
                elapsed = time.monotonic() - committed
                if elapsed >= 1.0 and not late_from:
                    late_from.append(len(fake_upstream.requests))
                if elapsed >= 2.5 and late_from and set(workers.models(late_from[0])) == both:
                    return answers
                assert elapsed < 20, f"one worker served all: {workers.models(late_from[0])}"
                answers += await _burst(client, token, 8, committed)
                workers.look()

    answers = asyncio.run(poll())
    assert {w.status for w in answers} == {200}
    late = [w for w in answers if w.sent_at >= 1.0]
    assert {w.provider for w in late} == {"b"}, [w for w in late if w.provider != "b"]
    # Upstream side: after the bound, each worker asked only for b's model.
    assert {pid: models for pid, models in workers.models(late_from[0]).items()} == {
        pid: {"b-model"} for pid in both
    }
    stale = [w.sent_at for w in answers if w.provider == "a"]
    fresh = [w.sent_at for w in answers if w.provider == "b"]
    print(
        f"last stale answer sent {max(stale, default=float('nan')):.3f} s after the commit, "
        f"first fresh {min(fresh):.3f} s; {len(answers)} requests, {len(late)} after 1 s"
    )


CONCURRENT = 500


@pytest.mark.parametrize("record_mode", ["inline", "write_behind"])
def test_every_answer_of_500_concurrent_requests_has_its_decision_row(
    shipped_server: Server, fake_upstream: FakeUpstream, token: str, tmp_path: Path
) -> None:
    """500 clients at once against a 0.5 s upstream, through the shipped server: every
    answered request id has its decision row once the server has stopped gracefully
    (the write-behind queue is flushed by then), and nothing was left in the spool."""
    _chain(fake_upstream, "a")
    fake_upstream.script("openai", *[Faults.slow(0.5)] * CONCURRENT)

    async def burst() -> list[httpx.Response | BaseException]:
        limits = httpx.Limits(max_connections=CONCURRENT, max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=shipped_server.base, timeout=120, limits=limits
        ) as client:
            headers = {"Authorization": f"Bearer {token}"}
            return list(
                await asyncio.gather(
                    *(
                        client.post("/v1/chat/completions", json=CHAT, headers=headers)
                        for _ in range(CONCURRENT)
                    ),
                    return_exceptions=True,
                )
            )

    responses = asyncio.run(burst())
    answered = [r for r in responses if isinstance(r, httpx.Response)]
    failures: dict[Any, int] = {}
    for r in responses:
        key = r.status_code if isinstance(r, httpx.Response) else type(r).__name__
        failures[key] = failures.get(key, 0) + 1
    assert failures == {200: CONCURRENT}, failures
    shipped_server.stop()  # graceful: whatever a worker holds is written
    ids = [r.headers["X-Request-ID"] for r in answered]
    assert len(set(ids)) == CONCURRENT
    rows = set(
        str(i)
        for i in RoutingDecision.objects.filter(request_id__in=ids).values_list(
            "request_id", flat=True
        )
    )
    assert set(ids) - rows == set()
    assert RoutingDecision.objects.filter(request_id__in=ids, status="ok").count() == CONCURRENT
    spool = tmp_path / "spool"
    assert not spool.exists() or not any(p.is_file() for p in spool.rglob("*"))


WORDS = "one two three four five six seven eight nine ten eleven twelve"


def test_a_client_leaving_mid_stream_closes_the_upstream_request_for_every_kind(
    shipped_server: Server, fake_upstream: FakeUpstream, token: str
) -> None:
    """Through the shipped server, one chain per vendor kind: the client reads two
    chunks of a 2.4 s stream and closes its connection; the worker closes the upstream
    request (the fake server's next write fails) and records ``client_disconnected``."""
    kinds = ["openai", "openai_compatible", "anthropic", "gemini"]
    for kind in kinds:
        chain = Chain.objects.create(name=f"k-{kind}")
        fields = upstream_fields(f"p-{kind}", kind, fake_upstream)
        row = Provider.objects.create(**{**fields, "supports_streaming": True})
        ChainEntry.objects.create(chain=chain, provider=row, position=0)
    for done, kind in enumerate(kinds):
        fake_upstream.script(VENDOR_OF_KIND[kind], Faults.stream(text=WORDS, interval=0.2))
        body = {**CHAT, "model": f"k-{kind}", "stream": True}
        with (
            httpx.Client(base_url=shipped_server.base, timeout=30) as client,
            client.stream(
                "POST",
                "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {token}"},
            ) as response,
        ):
            assert response.status_code == 200, response.read()
            request_id = response.headers["X-Request-ID"]
            received = chat_words(response, 2)
        assert received == ["one", " two"], kind
        deadline = time.monotonic() + 10
        while fake_upstream.disconnects < done + 1:
            assert time.monotonic() < deadline, f"{kind}: the upstream request was left open"
            time.sleep(0.05)
        while not RoutingDecision.objects.filter(request_id=request_id).exists():
            assert time.monotonic() < deadline + 10, f"{kind}: no decision row"
            time.sleep(0.1)
        attempt = RoutingDecision.objects.get(request_id=request_id).attempts.get()
        assert (attempt.provider, attempt.error_category) == (f"p-{kind}", "client_disconnected")
