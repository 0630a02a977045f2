"""llm_routing.retention, the purge task and ``manage.py llm_routing_purge``."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from llm_routing.models import Attempt, AuditJob, RoutingDecision
from llm_routing.retention import purge
from llm_routing.router import route
from llm_routing.tasks import purge_routing_logs
from llm_routing.types import AuditRequest

pytestmark = pytest.mark.django_db


def _decisions(count: int, *, age_days: float) -> list[int]:
    """Route ``count`` real requests (mock) and age their decision rows."""
    ids = []
    for i in range(count):
        routed = route(AuditRequest(task="summarize", input_text=f"input {age_days} {i}"))
        ids.append(RoutingDecision.objects.get(request_id=routed.request_id).pk)
    created = timezone.now() - timedelta(days=age_days)
    RoutingDecision.objects.filter(pk__in=ids).update(created_at=created)
    return ids


def _jobs(count: int, *, age_days: float, status: str = "done") -> list[str]:
    owner, _ = get_user_model().objects.get_or_create(username="owner")
    ids = [
        str(AuditJob.objects.create(owner=owner, task="t", status=status).pk) for _ in range(count)
    ]
    created = timezone.now() - timedelta(days=age_days)
    AuditJob.objects.filter(pk__in=ids).update(created_at=created)
    return ids


@pytest.fixture
def rows() -> dict[str, list]:
    return {
        "old": _decisions(5, age_days=31),
        "new": _decisions(3, age_days=29),
        "old_jobs": _jobs(3, age_days=40) + _jobs(1, age_days=40, status="pending"),
        "new_jobs": _jobs(2, age_days=1),
    }


def _remaining_ids() -> set[int]:
    return set(RoutingDecision.objects.values_list("pk", flat=True))


def test_purge_removes_exactly_the_old_rows_in_batches(rows: dict[str, list]) -> None:
    assert Attempt.objects.filter(decision_id__in=rows["old"]).count() == 5
    report = purge(batch_size=2)  # RETENTION_DAYS defaults to 30
    assert (report.decisions, report.attempts, report.jobs) == (5, 5, 4)
    assert _remaining_ids() == set(rows["new"])
    assert not Attempt.objects.filter(decision_id__in=rows["old"]).exists()
    assert Attempt.objects.filter(decision_id__in=rows["new"]).count() == 3
    assert {str(pk) for pk in AuditJob.objects.values_list("pk", flat=True)} == set(
        rows["new_jobs"]
    )
    assert purge(batch_size=2).decisions == 0  # idempotent


def test_dry_run_removes_nothing_and_counts_right(rows: dict[str, list]) -> None:
    report = purge(dry_run=True)
    assert (report.decisions, report.attempts, report.jobs, report.dry_run) == (5, 5, 4, True)
    assert _remaining_ids() == set(rows["old"]) | set(rows["new"])
    assert AuditJob.objects.count() == 6


@override_settings(LLM_ROUTING={"RETENTION_DAYS": 60, "RETENTION_BATCH_SIZE": 1})
def test_settings_drive_the_cutoff(rows: dict[str, list]) -> None:
    assert purge().decisions == 0
    assert purge(days=10).decisions == 8


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_arguments_are_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        purge(days=bad)
    with pytest.raises(ValueError, match="positive"):
        purge(batch_size=bad)


def test_management_command_dry_run_then_real(rows: dict[str, list]) -> None:
    out = StringIO()
    call_command("llm_routing_purge", "--dry-run", stdout=out)
    assert "Would delete 5 decision(s), 5 attempt(s) and 4 job(s)" in out.getvalue()
    assert RoutingDecision.objects.count() == 8
    out = StringIO()
    call_command("llm_routing_purge", "--days", "30", "--batch-size", "3", stdout=out)
    assert "Deleted 5 decision(s), 5 attempt(s) and 4 job(s)" in out.getvalue()
    assert _remaining_ids() == set(rows["new"])


def test_management_command_days_override(rows: dict[str, list]) -> None:
    call_command("llm_routing_purge", "--days", "100", stdout=StringIO())
    assert RoutingDecision.objects.count() == 8


def test_management_command_bad_days() -> None:
    with pytest.raises(CommandError, match="positive"):
        call_command("llm_routing_purge", "--days", "0")


def test_purge_task(rows: dict[str, list]) -> None:
    result = purge_routing_logs.apply().get()
    assert result["decisions"] == 5 and result["jobs"] == 4
    assert _remaining_ids() == set(rows["new"])
