"""End to end on the real services: gunicorn (``-c gunicorn.conf.py``: uvicorn workers,
ASGI, as production starts it) + a Celery worker (+ beat) as separate processes, on
PostgreSQL, with Redis and RabbitMQ as the broker.

Each test starts its processes in their own process group on a queue of its own (the
broker is shared with other runs) and kills the whole group at teardown, whatever
happened. Every wait is bounded. Addresses come from ``LLMR_TEST_*`` variables (see
tests/settings_services.py); run through ``python3 dev.py test --services``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from rest_framework.authtoken.models import Token

from llm_routing import jobs
from llm_routing.models import Attempt, AuditJob, Chain, ChainEntry, Provider, RoutingDecision
from llm_routing.router import route
from llm_routing.types import AuditRequest

from .support import database_url as _database_url
from .support import free_port as _free_port

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("LLMR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("LLMR_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
BROKERS = {"redis": REDIS_URL, "rabbitmq": AMQP_URL}
DEADLINE_S = 4.0  # REQUEST_DEADLINE_S of the spawned processes
LEASE_GRACE_S = 2.0  # → a dead worker's job is re-claimable after 6 s


def _wait_for(what: str, check: Callable[[], Any], *, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Stack:
    """The processes of one test: started on demand, all killed at teardown."""

    def __init__(self, broker: str, tmp: Path) -> None:
        self.broker = broker
        self.tmp = tmp
        self.queue = f"llmr-test-{uuid.uuid4().hex[:12]}"
        self.env = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG"}}
        self.env.update(
            DJANGO_SETTINGS_MODULE="tests.settings_services",
            LLMR_TEST_DATABASE_URL=_database_url(),  # the test database of this session
            LLMR_TEST_REDIS_URL=REDIS_URL,
            LLMR_TEST_CACHE_PREFIX=self.queue,
            LLMR_TEST_BROKER_URL=BROKERS[broker],
            LLMR_TEST_QUEUE=self.queue,
            # Redis: above the lease (6 s), so only a dead worker's message comes back.
            LLMR_TEST_VISIBILITY_TIMEOUT="8",
            LLMR_TEST_DEADLINE_S=str(DEADLINE_S),
            LLMR_TEST_LEASE_GRACE_S=str(LEASE_GRACE_S),
            LLM_ROUTING_PURGE_EVERY_S="1",
            PYTHONUNBUFFERED="1",
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.base_url = ""

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed as a whole
        )
        log.close()
        self.procs[name] = proc
        return proc

    def worker(self, name: str = "worker") -> subprocess.Popen[bytes]:
        return self._spawn(
            name,
            [
                "-m", "celery", "-A", "project", "worker", "-Q", self.queue,
                "--concurrency=1", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-n", f"{name}-{self.queue}@%h", "-l", "info",
            ],
        )  # fmt: skip

    def call(self, task: str, *args: str) -> None:
        """Publish one message to this stack's queue (``celery call``)."""
        result = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "project", "call", task,
             "--queue", self.queue, "--args", json.dumps(list(args))],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr

    def beat(self) -> subprocess.Popen[bytes]:
        schedule = self.tmp / "celerybeat-schedule"
        return self._spawn(
            "beat", ["-m", "celery", "-A", "project", "beat", "-s", str(schedule), "-l", "info"]
        )

    def web(self, workers: int = 1) -> str:
        port = _free_port()
        self.env.update(
            GUNICORN_BIND=f"127.0.0.1:{port}",
            WEB_CONCURRENCY=str(workers),
            GUNICORN_THREADS="4",
            GUNICORN_ACCESSLOG="",
        )
        proc = self._spawn("web", ["-m", "gunicorn", "-c", "gunicorn.conf.py"])
        self.base_url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, self.log("web")
            try:
                return httpx.get(self.base_url + "/health/", timeout=2).status_code in {401, 403}
            except httpx.TransportError:
                return False

        _wait_for("gunicorn to answer", up, timeout=30)
        return self.base_url

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def close(self) -> None:
        for name in list(self.procs):
            try:
                self.kill(name)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.delete_queue()

    def delete_queue(self) -> None:
        """Leave nothing of this test on the shared broker (queue, exchange, keys)."""
        if self.broker == "redis":
            import redis

            client = redis.Redis.from_url(BROKERS["redis"])
            try:
                for key in client.scan_iter(match=f"*{self.queue}*", count=500):
                    client.delete(key)
            finally:
                client.close()
            return
        from kombu import Connection

        with Connection(BROKERS[self.broker], connect_timeout=10) as conn:
            channel = conn.default_channel
            channel.queue_delete(self.queue)
            channel.exchange_delete(self.queue)

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


@pytest.fixture
def require_postgres() -> None:
    if connection.vendor != "postgresql":
        pytest.fail(
            "The services suite runs on PostgreSQL: use `python3 dev.py test --services` "
            "(or -p tests.services_plugin)."
        )


@pytest.fixture(params=sorted(BROKERS))
def stack(
    request: pytest.FixtureRequest, tmp_path: Path, require_postgres: None
) -> Iterator[Stack]:
    procs = Stack(request.param, tmp_path)
    try:
        yield procs
    finally:
        procs.close()


@pytest.fixture
def token() -> str:
    user = get_user_model().objects.create_user("e2e", password="pw-e2e-123")
    return Token.objects.create(user=user).key


def _slow_provider() -> Provider:
    """A provider that takes 3 s, in a chain anyone may use (so the token user may name
    it: naming a provider in no chain needs a permission — docs/operations.md)."""
    row = Provider.objects.create(
        name="slow", kind="sleepy", model="sleepy-1", params={"sleep_s": 3}, max_retries=0
    )
    ChainEntry.objects.create(chain=Chain.objects.create(name="slow-only"), provider=row)
    return row


def _submit(stack: Stack, token: str, **extra: Any) -> dict[str, Any]:
    body = {"task": "summarize", "input_text": "End-to-end input.", "async": True, **extra}
    response = httpx.post(
        stack.base_url + "/audit/",
        json=body,
        headers={"Authorization": f"Token {token}"},
        timeout=30,
    )
    assert response.status_code == 202, response.text
    return response.json()


def _poll_done(stack: Stack, token: str, url: str, *, timeout: float = 60.0) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        response = httpx.get(url, headers={"Authorization": f"Token {token}"}, timeout=10)
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        assert data["status"] != "failed", data
        return data if data["status"] == "done" else None

    try:
        return _wait_for("the job to finish", done, timeout=timeout)
    except AssertionError:
        raise AssertionError(
            "\n".join(stack.log(n) for n in ("web", "worker", "worker2"))
        ) from None


def test_async_job_through_gunicorn_and_a_real_worker(stack: Stack, token: str) -> None:
    stack.web()
    # gunicorn.conf.py as shipped: ASGI, uvicorn workers (the async views serve /audit/).
    assert httpx.get(stack.base_url + "/health/", timeout=5).headers["server"] == "uvicorn"
    stack.worker()
    submitted = _submit(stack, token)
    assert submitted["status"] == "pending"  # not eager: a real queue
    assert submitted["status_url"] == f"{stack.base_url}/audit/jobs/{submitted['job_id']}/"
    data = _poll_done(stack, token, submitted["status_url"])
    assert data["request_id"] == submitted["job_id"]
    assert data["routing_metadata"]["request_id"] == submitted["job_id"]
    assert data["result"]["provider"] == "mock" and data["result"]["status"] == "ok"
    assert data["routing_metadata"]["attempted_providers"] == ["mock"]
    assert data["diagnostics"] == data["routing_metadata"]
    job = AuditJob.objects.get(pk=submitted["job_id"])
    assert job.payload is None and job.claims == 1
    assert RoutingDecision.objects.filter(request_id=job.pk).count() == 1


def test_killed_worker_job_is_redelivered_and_logged_once(stack: Stack, token: str) -> None:
    _slow_provider()
    stack.web()
    stack.worker()
    submitted = _submit(stack, token, provider="slow")
    job_id = submitted["job_id"]

    def running() -> bool:
        return AuditJob.objects.filter(pk=job_id, status="running").exists()

    _wait_for("the worker to claim the job", running, timeout=60)
    stack.kill("worker")  # SIGKILL mid-call: no ack, no cleanup
    job = AuditJob.objects.get(pk=job_id)
    assert job.status == "running" and job.claims == 1 and job.payload is not None
    assert not RoutingDecision.objects.filter(request_id=job_id).exists()

    stack.worker("worker2")  # the message comes back; the lease expires; it is rerun
    data = _poll_done(stack, token, submitted["status_url"], timeout=90)
    assert data["result"]["provider"] == "slow"
    job.refresh_from_db()
    assert job.claims == 2
    assert job.payload is None
    assert RoutingDecision.objects.filter(request_id=job_id).count() == 1
    assert RoutingDecision.objects.count() == 1
    # The rerun logged its attempt once (the killed run wrote none).
    assert Attempt.objects.filter(decision__request_id=job_id).count() == 1
    if stack.broker == "rabbitmq":
        # RabbitMQ redelivers at once, while the dead run's lease is still live: the
        # redelivery waited (task retry) instead of routing in parallel.
        assert "Retry in" in stack.log("worker2"), stack.log("worker2")


def test_beat_schedules_the_retention_task_which_removes_exactly_the_old_rows(
    stack: Stack,
) -> None:
    ids = {}
    for label, age_days in (("old", 45), ("new", 2)):
        routed = [route(AuditRequest(task="t", input_text=f"{label} {i}")) for i in range(3)]
        ids[label] = {RoutingDecision.objects.get(request_id=r.request_id).pk for r in routed}
        RoutingDecision.objects.filter(pk__in=ids[label]).update(
            created_at=timezone.now() - timedelta(days=age_days)
        )
    stack.worker()
    stack.beat()  # LLM_ROUTING_PURGE_EVERY_S=1

    def purged() -> bool:
        return not RoutingDecision.objects.filter(pk__in=ids["old"]).exists()

    try:
        _wait_for("beat + worker to purge the old rows", purged, timeout=60)
    except AssertionError:
        raise AssertionError(stack.log("beat") + stack.log("worker")) from None
    assert set(RoutingDecision.objects.values_list("pk", flat=True)) == ids["new"]
    assert not Attempt.objects.filter(decision_id__in=ids["old"]).exists()
    assert Attempt.objects.filter(decision_id__in=ids["new"]).count() == 3


def test_a_duplicate_message_delivered_concurrently_does_not_route_twice(
    stack: Stack, token: str
) -> None:
    _slow_provider()
    stack.web()
    stack.worker("worker")
    stack.worker("worker2")
    submitted = _submit(stack, token, provider="slow")
    job_id = submitted["job_id"]

    def running() -> bool:
        return AuditJob.objects.filter(pk=job_id, status="running").exists()

    _wait_for("a worker to claim the job", running, timeout=60)
    stack.call("llm_routing.run_audit_job", job_id)  # the same job, while it runs
    data = _poll_done(stack, token, submitted["status_url"], timeout=90)
    assert data["result"]["provider"] == "slow"
    # Let the duplicate come back from its retry and find the job finished.
    _wait_for(
        "the duplicate to be retried",
        lambda: "Retry in" in stack.log("worker") + stack.log("worker2"),
        timeout=30,
    )
    job = AuditJob.objects.get(pk=job_id)
    assert job.claims == 1  # routed by exactly one delivery
    assert RoutingDecision.objects.filter(request_id=job_id).count() == 1


def test_concurrent_claims_on_postgresql_have_one_winner(require_postgres: None) -> None:
    owner = get_user_model().objects.create_user("racer", password="pw-racer-123")
    job = AuditJob.objects.create(owner=owner, task="t", payload={"task": "t"})
    barrier = threading.Barrier(8)
    won: list[bool] = []

    def claim() -> None:
        try:
            barrier.wait(timeout=30)
            claimed, _ = jobs.claim_job(job.pk)
            won.append(claimed is not None)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(won) == 8
    assert won.count(True) == 1
    job.refresh_from_db()
    assert job.claims == 1 and job.status == "running"
