"""A decision's page: its attempts as an SVG timeline (bars on a ms axis, retries
marked, skips as markers with the reason, the served attempt outlined), rounded
figures, and a link to explain-route with the same inputs."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from llm_routing.charts import TimelineItem, nice_ticks, timeline_svg
from llm_routing.errors import UnavailableError
from llm_routing.models import Attempt, RoutingDecision
from llm_routing.router import route
from llm_routing.types import AuditRequest

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db


def no_sleep(seconds: float) -> None:
    return None


@pytest.fixture
def failover(scripted: Any, key_env: str) -> RoutingDecision:
    off = make_provider("off", enabled=False)
    a = make_provider("a", max_retries=2)
    b = make_provider("b")
    make_chain("main", [off, a, b], is_default=True)
    scripted.scripts["a"] = [UnavailableError("down", http_status=503)]
    route(AuditRequest(task="summarize", input_text="hello", route="docs"), sleeper=no_sleep)
    return RoutingDecision.objects.get()


def page(admin_client: Any, decision: RoutingDecision) -> str:
    url = reverse("admin:llm_routing_routingdecision_change", args=[decision.pk])
    response = admin_client.get(url)
    assert response.status_code == 200
    return str(response.content.decode())


def test_failover_shows_two_bars_a_skip_and_retries(admin_client, failover):
    assert list(Attempt.objects.values_list("provider", "outcome", "retries")) == [
        ("off", "skipped", 0),
        ("a", "error", 2),
        ("b", "ok", 0),
    ]
    html = page(admin_client, failover)
    start = html.index('<svg xmlns="http://www.w3.org/2000/svg" class="llmr-timeline"')
    svg = html[start : html.index("</svg>", start)]
    assert svg.count('class="llmr-bar ') == 2
    assert svg.count("llmr-served") == 1
    assert svg.count('class="llmr-retry"') == 2
    assert "skipped: disabled" in svg
    assert "unavailable 503" in svg and "2 retries" in svg
    assert ">ms</text>" in svg


def test_figures_are_rounded(admin_client, failover):
    Attempt.objects.filter(provider="b").update(latency_ms=12.345678901234)
    RoutingDecision.objects.update(total_latency_ms=1234.5678901234)
    html = page(admin_client, failover)
    assert not re.search(r"\d\.\d{4,}", html.replace(failover.input_sha256, ""))
    assert "1,235 ms" in html
    listing = admin_client.get(reverse("admin:llm_routing_routingdecision_changelist"))
    assert "1,235 ms" in listing.content.decode()


def test_link_to_explain_with_the_same_inputs(admin_client, failover):
    html = page(admin_client, failover)
    link = reverse("admin:llm_routing_explain") + "?task=summarize&amp;route=docs"
    assert link in html


def test_timeline_escapes_text_and_scales():
    svg = timeline_svg([TimelineItem(0, "<b>x</b>", "error", 50.0, reason="<script>")])
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert nice_ticks(1234) == [0, 500, 1000, 1500]
    assert nice_ticks(0) == [0.0, 1.0]
