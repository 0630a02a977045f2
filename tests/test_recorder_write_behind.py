"""Issue 14 item 4: decisions written off the request path, nothing lost.

``recorder.submit`` queues a decision's rows for one writer thread per process, which
writes them in batches (one INSERT of decisions, one of attempts); a batch the database
refuses, or a record that finds the queue full, goes to the spool; ``recorder.flush``
and the exit hook wait for what was submitted. The writer thread uses its own
connection, so these tests commit for real (``transaction=True``); failures are real
(the attempt table renamed away), and exit is a real interpreter exiting.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from llm_routing import recorder, spool
from llm_routing.checks import check_settings
from llm_routing.errors import UnavailableError
from llm_routing.models import Attempt, RoutingDecision
from llm_routing.router import route
from llm_routing.types import AuditRequest, RoutingResult
from llm_routing.write_behind import Rows, WriteBehind

from .conftest import make_chain, make_provider
from .support import clean_env, python

pytestmark = pytest.mark.django_db(transaction=True)

BACKENDS = [
    pytest.param("sqlite", id="embedded"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.services),
]
SECRET = "write-behind secret input 7f3a"
ATTEMPTS = Attempt._meta.db_table


@pytest.fixture
def routed(
    scripted: Any, key_env: str
) -> Callable[[int], list[tuple[AuditRequest, RoutingResult]]]:
    """Real routing results (not recorded): a skipped, a failed and a served attempt."""
    make_chain(
        "main",
        [make_provider("a", enabled=False), make_provider("b", max_retries=0), make_provider("c")],
        is_default=True,
    )

    def build(count: int) -> list[tuple[AuditRequest, RoutingResult]]:
        out = []
        for i in range(count):
            scripted.scripts["b"] = [UnavailableError(http_status=503)]
            request = AuditRequest(task="wb", input_text=f"{SECRET} {i}", route="r1")
            out.append((request, route(request, sleeper=lambda s: None, persist=False)))
        return out

    return build


@pytest.fixture
def spool_dir(settings: Any, tmp_path: Path) -> Path:
    settings.LLM_ROUTING = {"DEFAULT_CHAIN": [], "SPOOL_DIR": str(tmp_path)}
    return tmp_path


def spooled(directory: Path) -> list[dict[str, Any]]:
    path = directory / spool.CURRENT
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def in_threads(work: Sequence[Callable[[], None]], threads: int) -> None:
    """Run *work* from *threads* threads at once (a barrier lines them up)."""
    barrier = threading.Barrier(threads)
    chunks = [work[i::threads] for i in range(threads)]

    def run(chunk: Sequence[Callable[[], None]]) -> None:
        barrier.wait()
        for call in chunk:
            call()

    pool = [threading.Thread(target=run, args=(chunk,)) for chunk in chunks]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


class Gate:
    """Holds the writer thread inside its write until opened (the write itself is the
    recorder's real ``write_batch``)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.batches: list[int] = []

    def write(self, batch: Sequence[Rows]) -> list[Rows]:
        self.entered.set()
        assert self.opened.wait(30)
        self.batches.append(len(batch))
        return recorder.write_queued(batch)


# --- written, all of it ------------------------------------------------------------


def test_submits_from_many_threads_are_all_written_after_flush(routed, spool_dir):
    results = routed(240)
    start = recorder.write_behind_stats()
    in_threads([lambda r=r: recorder.submit(*r) for r in results], threads=12)
    assert recorder.flush(timeout=30)

    stats = recorder.write_behind_stats()
    assert stats.submitted - start.submitted == 240
    assert stats.written - start.written == 240
    assert stats.spooled == start.spooled and stats.lost == start.lost
    assert RoutingDecision.objects.count() == 240
    assert Attempt.objects.count() == 3 * 240
    assert not spooled(spool_dir)

    request, result = results[0]  # the first: b failed (later ones skip its open circuit)
    decision = RoutingDecision.objects.get(request_id=result.request_id)
    expected = recorder.decision_rows(request, result)["decision"]
    for field in ("task", "route", "router_mode", "chain_name", "selected_provider", "status"):
        assert getattr(decision, field) == expected[field]
    assert (decision.fallback_used, decision.fallback_reason) == (True, "disabled")
    assert decision.input_length == len(f"{SECRET} 0")
    assert decision.total_latency_ms == pytest.approx(result.total_latency_ms)
    rows = list(decision.attempts.order_by("index"))
    assert [(a.provider, a.outcome, a.served) for a in rows] == [
        ("a", "skipped", False),
        ("b", "error", False),
        ("c", "ok", True),
    ]
    assert (rows[1].http_status, rows[1].transient, rows[1].error_category) == (
        503,
        True,
        "unavailable",
    )


def test_submit_on_an_event_loop_touches_no_database(routed, spool_dir):
    # Django raises SynchronousOnlyOperation for any ORM call made on a running loop:
    # had submit touched the database, these decisions would be missing.
    results = routed(5)

    async def serve() -> None:
        for pair in results:
            recorder.submit(*pair)

    asyncio.run(serve())
    assert recorder.flush(timeout=30)
    assert recorder.missing_decisions([r.request_id for _, r in results]) == set()


def test_record_mode_write_behind_routes_through_the_queue(routed, settings, tmp_path):
    settings.LLM_ROUTING = {
        "DEFAULT_CHAIN": [],
        "SPOOL_DIR": str(tmp_path),
        "RECORD_MODE": "write_behind",
    }
    before = recorder.write_behind_stats().submitted
    answered = [route(AuditRequest(task="t", input_text=SECRET)) for _ in range(5)]
    assert recorder.write_behind_stats().submitted == before + 5
    assert recorder.flush(timeout=30)
    assert recorder.missing_decisions([r.request_id for r in answered]) == set()


@pytest.mark.services
def test_500_concurrent_submits_on_postgresql_cost_the_same_queries_per_batch(routed, spool_dir):
    if connection.vendor != "postgresql":
        pytest.skip("the services suite runs this on PostgreSQL")
    results = routed(500)
    per_batch: list[tuple[int, list[str]]] = []

    def counted(batch: Sequence[Rows]) -> list[Rows]:
        statements: list[str] = []

        def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            statements.append(sql.split()[0])
            return execute(sql, params, many, context)

        with connection.execute_wrapper(count):  # the writer thread's own connection
            recorder.write_batch(batch)
        per_batch.append((len(batch), statements))
        return []  # all written (write_batch raises otherwise)

    writer = WriteBehind(write=counted, spill=spool.append_many, maxsize=lambda: 10_000)
    rows = [recorder.decision_rows(*r) for r in results]
    in_threads([lambda one=one: writer.submit(one) for one in rows], threads=50)
    assert writer.flush(timeout=60)

    assert sum(size for size, _ in per_batch) == 500
    assert writer.stats().batches == len(per_batch)
    assert max(size for size, _ in per_batch) > 1  # batched, not one by one
    # Two statements per batch whatever its size (inside one BEGIN ... COMMIT).
    assert {tuple(statements) for _, statements in per_batch} == {("INSERT", "INSERT")}
    assert RoutingDecision.objects.count() == 500 and Attempt.objects.count() == 1500
    assert recorder.missing_decisions([r.request_id for _, r in results]) == set()


# --- the database refuses: spooled, then replayed -------------------------------------


@pytest.fixture
def attempts_table_away() -> Iterator[Callable[[], None]]:
    """Renames the attempt table away (a real failure for the writer's INSERT); the
    returned callable renames it back."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {ATTEMPTS} RENAME TO {ATTEMPTS}_away")
    state = {"away": True}

    def restore() -> None:
        if state["away"]:
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER TABLE {ATTEMPTS}_away RENAME TO {ATTEMPTS}")
            state["away"] = False

    yield restore
    restore()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_refused_batch_is_spooled_and_replayed_by_the_flush_command(
    routed, spool_dir, backend, attempts_table_away, caplog
):
    results = routed(30)
    start = recorder.write_behind_stats()
    in_threads([lambda r=r: recorder.submit(*r) for r in results], threads=6)
    assert recorder.flush(timeout=30)
    attempts_table_away()  # back

    stats = recorder.write_behind_stats()
    assert stats.spooled - start.spooled == 30 and stats.lost == start.lost
    # Each batch is one transaction: no decision was left without its attempts.
    assert RoutingDecision.objects.count() == 0
    lines = spooled(spool_dir)
    assert sorted(line["decision"]["request_id"] for line in lines) == sorted(
        r.request_id for _, r in results
    )
    assert SECRET not in (spool_dir / spool.CURRENT).read_text()  # length + hash only
    assert "spooled to" in caplog.text

    out = StringIO()
    call_command("llm_routing_spool_flush", stdout=out)
    assert "Wrote 30 spooled decision(s)" in out.getvalue()
    assert RoutingDecision.objects.count() == 30 and Attempt.objects.count() == 90
    assert recorder.missing_decisions([r.request_id for _, r in results]) == set()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_record_the_database_refuses_does_not_hold_back_its_batch(routed, spool_dir, backend):
    results = routed(4)
    rows = [recorder.decision_rows(*r) for r in results]
    ids = [one["decision"]["request_id"] for one in rows]
    recorder.record(*results[1])  # already recorded: its queued copy is a duplicate
    rows[2]["decision"]["input_length"] = -1  # breaks the column's CHECK (>= 0)
    writer = WriteBehind(
        write=recorder.write_queued, spill=spool.append_many, maxsize=lambda: 10, linger_s=5
    )
    for one in rows:
        writer.submit(one)
    assert writer.flush(timeout=30)  # ends the linger: the four are one batch

    stats = writer.stats()
    assert (stats.written, stats.spooled, stats.lost, stats.batches) == (3, 1, 0, 1)
    recorded = {str(i) for i in RoutingDecision.objects.values_list("request_id", flat=True)}
    assert recorded == {ids[0], ids[1], ids[3]}
    assert Attempt.objects.count() == 3 * 3
    assert [line["decision"]["request_id"] for line in spooled(spool_dir)] == [ids[2]]


# --- the queue is full: spooled, not waited for ---------------------------------------


def test_a_full_queue_spools_instead_of_blocking(routed, spool_dir, caplog):
    results = routed(10)
    gate = Gate()
    with override_settings(
        LLM_ROUTING={"DEFAULT_CHAIN": [], "SPOOL_DIR": str(spool_dir), "RECORD_QUEUE_SIZE": 3}
    ):
        writer = WriteBehind(
            write=gate.write,
            spill=spool.append_many,
            maxsize=lambda: recorder.routing_settings.RECORD_QUEUE_SIZE,
            batch_size=1,
        )
        rows = [recorder.decision_rows(*r) for r in results]
        writer.submit(rows[0])
        assert gate.entered.wait(30)  # the writer holds record 0, the queue is empty
        for one in rows[1:]:
            writer.submit(one)  # returns at once: 3 queued, 6 spooled
        stats = writer.stats()
        assert (stats.submitted, stats.queued, stats.overflowed, stats.spooled) == (4, 3, 6, 6)
        assert [line["decision"]["request_id"] for line in spooled(spool_dir)] == [
            r.request_id for _, r in results[4:]
        ]
        assert "Write-behind queue full (RECORD_QUEUE_SIZE=3)" in caplog.text
        gate.opened.set()
        assert writer.flush(timeout=30)
        assert writer.stats().written == 4
        assert RoutingDecision.objects.count() == 4
        # Written after the gate opened, each keeps the time it was decided.
        for one in rows[:4]:
            decision = RoutingDecision.objects.get(request_id=one["decision"]["request_id"])
            assert decision.created_at == datetime.fromisoformat(one["decision"]["created_at"])
        assert recorder.flush_spool().written == 6
    assert recorder.missing_decisions([r.request_id for _, r in results]) == set()


def test_flush_times_out_while_the_database_holds_the_batch(routed, spool_dir):
    gate = Gate()
    writer = WriteBehind(write=gate.write, spill=spool.append_many, maxsize=lambda: 10)
    writer.submit(recorder.decision_rows(*routed(1)[0]))
    assert gate.entered.wait(30)
    assert writer.flush(timeout=0.05) is False
    gate.opened.set()
    assert writer.flush(timeout=30) is True
    assert RoutingDecision.objects.count() == 1


# --- the process exits -------------------------------------------------------------

EXIT_SCRIPT = r"""
import json, os, sys
import django
django.setup()
from django.core.management import call_command
from django.db import connections
from django.test.utils import override_settings
call_command("migrate", verbosity=0)
override_settings(LLM_ROUTING={"DEFAULT_CHAIN": [], "RECORD_MODE": "write_behind"}).enable()
from llm_routing import recorder
from llm_routing.router import route
from llm_routing.types import AuditRequest

recorder._writer.linger_s = 5.0  # nothing is written before exit unless exit flushes
def answer(n):
    return [route(AuditRequest(task="t", input_text="x", provider="mock")).request_id
            for _ in range(n)]

parent = answer(20)
connections.close_all()  # as a preloading server does before it forks its workers
pid = os.fork()
if pid == 0:  # a worker: its own queue and thread, not the parent's queued records
    child = answer(7)
    stats = recorder.write_behind_stats()
    print(json.dumps({"child": child, "submitted": stats.submitted}), flush=True)
    sys.exit(0)  # a normal exit: atexit flushes
_, status = os.waitpid(pid, 0)
print(json.dumps({"parent": parent, "status": status}), flush=True)
"""


def test_a_normal_exit_flushes_parent_and_forked_child(tmp_path):
    database = tmp_path / "exit.sqlite3"
    env = clean_env(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=f"sqlite:///{database}",
        PYTHONPATH=str(Path(__file__).resolve().parent.parent),
    )
    done = python("-c", EXIT_SCRIPT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        report.update(json.loads(line))
    assert report["status"] == 0
    assert report["submitted"] == 7  # the child did not inherit the parent's 20
    assert "lost" not in done.stderr and "Traceback" not in done.stderr
    with sqlite3.connect(database) as db:
        stored = {
            str(uuid.UUID(row[0]))
            for row in db.execute(f"SELECT request_id FROM {RoutingDecision._meta.db_table}")
        }
        attempts = db.execute(f"SELECT COUNT(*) FROM {ATTEMPTS}").fetchone()[0]
    assert stored == set(report["parent"]) | set(report["child"])
    assert len(stored) == 27 and attempts == 27


# --- the benchmark's invariant ---------------------------------------------------------


def test_missing_decisions_and_the_check_command(routed, tmp_path):
    results = routed(3)
    for request, result in results[:2]:
        recorder.record(request, result)
    ids = [r.request_id for _, r in results]
    absent = ids[2]
    assert recorder.missing_decisions([*ids, "not-a-uuid"]) == {absent, "not-a-uuid"}

    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(ids[:2]) + "\n\n")
    out = StringIO()
    call_command("llm_routing_check_decisions", "--ids-file", str(ids_file), stdout=out)
    assert "All 2 request id(s) have a decision row." in out.getvalue()

    ids_file.write_text("\n".join(ids) + "\n")
    out = StringIO()
    with pytest.raises(CommandError, match="1 of 3 request id"):
        call_command("llm_routing_check_decisions", "--ids-file", str(ids_file), stdout=out)
    assert out.getvalue().split() == [absent]


# --- settings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"RECORD_MODE": "later"}, ["llm_routing.E005"]),
        ({"RECORD_MODE": "write_behind"}, ["llm_routing.W003"]),
        ({"RECORD_MODE": "write_behind", "SPOOL_DIR": "/tmp/spool"}, []),
        ({"RECORD_QUEUE_SIZE": 0}, ["llm_routing.E002"]),
        ({"RECORD_QUEUE_SIZE": 2.5}, ["llm_routing.E002"]),
        ({"RECORD_QUEUE_SIZE": 50}, []),
    ],
)
def test_record_settings_are_checked(value: dict[str, Any], expected: list[str]) -> None:
    with override_settings(LLM_ROUTING={"DEFAULT_CHAIN": [], **value}):
        assert [m.id for m in check_settings()] == expected
