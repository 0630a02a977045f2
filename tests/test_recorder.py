"""The recorder: one decision + N attempts per request, in one transaction, no raw input."""

from __future__ import annotations

import hashlib
import io
from unittest import mock

import pytest
from django.core.management import call_command
from django.db import DatabaseError

from llm_routing import recorder
from llm_routing.errors import UnavailableError
from llm_routing.models import Attempt, RoutingDecision
from llm_routing.router import route
from llm_routing.types import AuditRequest

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db

CANARY_INPUT = "CANARY-INPUT-7c1d2e9f the secret plan is in here"
CANARY_INSTRUCTIONS = "CANARY-INSTR-51aa9b do the thing"


def test_one_decision_and_one_row_per_candidate(scripted, key_env):
    a = make_provider("a", enabled=False)
    b = make_provider("b", max_retries=0)
    c = make_provider("c")
    make_chain("main", [a, b, c], is_default=True)
    scripted.scripts["b"] = [UnavailableError(http_status=502)]
    routed = route(
        AuditRequest(task="t", input_text=CANARY_INPUT, route="r1"), sleeper=lambda s: None
    )
    assert RoutingDecision.objects.count() == 1
    d = RoutingDecision.objects.get()
    assert str(d.request_id) == routed.request_id
    assert (d.task, d.route, d.router_mode, d.chain_name) == ("t", "r1", "default", "main")
    assert (d.selected_provider, d.status, d.mode) == ("c", "ok", "live")
    assert d.fallback_used is True and d.fallback_reason == "disabled"
    assert d.input_length == len(CANARY_INPUT)
    assert d.input_sha256 == hashlib.sha256(CANARY_INPUT.encode()).hexdigest()
    rows = list(d.attempts.order_by("index"))
    assert [(r.provider, r.outcome) for r in rows] == [
        ("a", "skipped"),
        ("b", "error"),
        ("c", "ok"),
    ]
    assert rows[1].http_status == 502 and rows[1].transient is True
    assert rows[1].error_category == "unavailable"
    assert [r.served for r in rows] == [False, False, True]


def test_raw_input_and_key_never_reach_the_database(scripted, key_env):
    make_chain("main", [make_provider("a")], is_default=True)
    route(AuditRequest(task="t", input_text=CANARY_INPUT, instructions=CANARY_INSTRUCTIONS))
    route(AuditRequest(task="t", input_text=CANARY_INPUT, provider="mock"))
    out = io.StringIO()
    call_command("dumpdata", "llm_routing", stdout=out)
    dump = out.getvalue()
    assert RoutingDecision.objects.count() == 2 and len(dump) > 200
    assert "CANARY-INPUT" not in dump
    assert "CANARY-INSTR" not in dump
    assert key_env not in dump


def test_a_failed_write_leaves_nothing_half_written(scripted, key_env, caplog):
    make_chain("main", [make_provider("a")], is_default=True)
    with mock.patch.object(Attempt.objects, "bulk_create", side_effect=DatabaseError("disk full")):
        routed = route(AuditRequest(task="t", input_text="x"))
    # the caller still gets its answer ...
    assert routed.result.status == "ok"
    # ... and the decision was rolled back with its attempts.
    assert RoutingDecision.objects.count() == 0
    assert "Could not record routing decision" in caplog.text


def test_record_is_the_only_writer_used_by_route(scripted, key_env):
    make_chain("main", [make_provider("a")], is_default=True)
    with mock.patch("llm_routing.recorder.record_or_spool", wraps=recorder.record_or_spool) as spy:
        route(AuditRequest(task="t", input_text="x"))
        route(AuditRequest(task="t", input_text="x"), persist=False)
    assert spy.call_count == 1
    assert RoutingDecision.objects.count() == 1
