"""Issue 11 (part A, item 10): a decision the database refuses is spooled, not lost, and
written by the flush once the database is back — counted against the answers given.

The database is made unwritable mid-run for real: while requests are being answered, the
decision table is renamed away (from the router's own ``before_provider_call`` signal,
i.e. after authentication and before recording), then renamed back. Run on SQLite in
the embedded suite and, marked ``services``, on PostgreSQL.
"""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from llm_routing.models import Attempt, RoutingDecision
from llm_routing.recorder import flush_spool
from llm_routing.signals import before_provider_call

pytestmark = pytest.mark.django_db

BACKENDS = [
    pytest.param("sqlite", id="embedded"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.services),
]
TABLE = RoutingDecision._meta.db_table
SECRET_INPUT = "confidential input text 0042"


class Outage:
    """Renames the decision table away on the next provider call, and back on demand."""

    def __init__(self) -> None:
        self.armed = False
        self.down = False

    def on_call(self, sender: Any, **kwargs: Any) -> None:
        if self.armed and not self.down:
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {TABLE}_away")
            self.down = True

    def restore(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TABLE}_away RENAME TO {TABLE}")
        self.down = False
        self.armed = False


def _audit(api):
    body = {"task": "t", "input_text": SECRET_INPUT}
    return api.post("/audit/", data=json.dumps(body), content_type="application/json")


@pytest.mark.parametrize("backend", BACKENDS)
def test_decisions_refused_mid_run_are_spooled_and_flushed(api, settings, tmp_path, backend):
    settings.LLM_ROUTING = {"SPOOL_DIR": str(tmp_path)}
    outage = Outage()
    before_provider_call.connect(outage.on_call)
    answered: list[str] = []
    try:
        for phase in ("up", "down", "up"):
            outage.armed = phase == "down"
            for _ in range(4):
                response = _audit(api)
                assert response.status_code == 200
                answered.append(response.json()["request_id"])
            if outage.down:
                # While the table is away nothing could be recorded ...
                outage.restore()
                assert RoutingDecision.objects.count() == 4
    finally:
        before_provider_call.disconnect(outage.on_call)
        if outage.down:
            outage.restore()

    spooled = (tmp_path / "decisions.jsonl").read_text()
    assert len(spooled.splitlines()) == 4
    assert SECRET_INPUT not in spooled  # length + SHA-256 only, as in the rows
    assert RoutingDecision.objects.count() == 8

    report = flush_spool()
    assert (report.written, report.already_recorded, report.left) == (4, 0, 0)
    recorded = set(RoutingDecision.objects.values_list("request_id", flat=True))
    assert {str(r) for r in recorded} == set(answered)
    assert Attempt.objects.count() == len(answered)  # one attempt each (the mock)
    assert not list(tmp_path.glob("decisions*"))

    # Idempotent: nothing left, nothing written twice.
    assert flush_spool().written == 0
    assert RoutingDecision.objects.count() == len(answered)


def test_flush_skips_decisions_already_recorded_and_keeps_created_at(api, settings, tmp_path):
    settings.LLM_ROUTING = {"SPOOL_DIR": str(tmp_path)}
    request_id = _audit(api).json()["request_id"]
    decision = RoutingDecision.objects.get(request_id=request_id)
    rows = {
        "decision": {
            **{f: getattr(decision, f) for f in ("task", "route", "rule", "router_mode")},
            "request_id": request_id,
            "status": "ok",
            "mode": "mock",
            "input_length": 3,
            "input_sha256": "0" * 64,
            "created_at": "2026-01-02T03:04:05+00:00",
        },
        "attempts": [],
    }
    other = {
        **rows,
        "decision": {**rows["decision"], "request_id": "0" * 8 + "-0000-4000-8000-" + "0" * 12},
    }
    lines = [json.dumps(rows), json.dumps(other), "{not json"]
    (tmp_path / "decisions.jsonl").write_text("\n".join(lines) + "\n")
    out = StringIO()
    call_command("llm_routing_spool_flush", stdout=out)
    assert "Wrote 1 spooled decision(s); 1 were already recorded; 1 rejected" in out.getvalue()
    restored = RoutingDecision.objects.get(request_id=other["decision"]["request_id"])
    assert restored.created_at.isoformat() == "2026-01-02T03:04:05+00:00"
    assert (tmp_path / "rejected.jsonl").read_text() == "{not json\n"


def test_flush_command_without_a_spool_dir_says_so():
    with pytest.raises(CommandError, match="SPOOL_DIR"):
        call_command("llm_routing_spool_flush")


def test_flush_task_runs_the_same_flush(settings, tmp_path: Path):
    from llm_routing.tasks import flush_decision_spool

    settings.LLM_ROUTING = {"SPOOL_DIR": str(tmp_path)}
    assert flush_decision_spool.apply().get() == {
        "written": 0,
        "already_recorded": 0,
        "rejected": 0,
        "left": 0,
    }


def test_two_flushes_of_the_same_file_write_each_decision_once(api, settings, tmp_path):
    # A concurrent flush may insert a line between this flush's check and its insert:
    # the unique request_id turns that into "already recorded", not a stopped flush.
    settings.LLM_ROUTING = {"SPOOL_DIR": str(tmp_path)}
    request_id = _audit(api).json()["request_id"]
    decision = RoutingDecision.objects.get(request_id=request_id)
    rows = {
        "decision": {
            "request_id": request_id,
            "task": decision.task,
            "router_mode": decision.router_mode,
            "status": decision.status,
            "mode": decision.mode,
            "input_length": decision.input_length,
            "input_sha256": decision.input_sha256,
        },
        "attempts": [],
    }
    (tmp_path / "decisions.jsonl").write_text(json.dumps(rows) + "\n")
    exists = RoutingDecision.objects.filter
    # Simulate the race: the existence check sees nothing, the insert hits the row.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            RoutingDecision.objects,
            "filter",
            lambda **kw: exists(request_id="00000000-0000-4000-8000-000000000000"),
        )
        report = flush_spool()
    assert (report.written, report.already_recorded, report.left) == (0, 1, 0)
    assert RoutingDecision.objects.filter(request_id=request_id).count() == 1
    assert not list(tmp_path.glob("decisions*"))
