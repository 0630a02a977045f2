"""The dashboard, a page of its own linked from the top of the admin index: requests,
fallback and failure rates, attempts by outcome per provider, p50/p95 latency per
provider, top skip reasons, per window, as SVG."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from llm_routing import dashboard
from llm_routing.models import Attempt, RoutingDecision

pytestmark = pytest.mark.django_db


def decision(age: timedelta, attempts: list[tuple[str, str, str, float]], **kw: Any) -> None:
    fields = {"status": "ok", **kw}
    row = RoutingDecision.objects.create(
        task="t", router_mode="default", mode="live", input_length=1,
        input_sha256="0" * 64, **fields,
    )  # fmt: skip
    RoutingDecision.objects.filter(pk=row.pk).update(created_at=timezone.now() - age)
    for index, (provider, outcome, reason, latency) in enumerate(attempts):
        Attempt.objects.create(
            decision=row, index=index, provider=provider, outcome=outcome, reason=reason,
            latency_ms=latency, served=outcome == "ok",
        )  # fmt: skip


@pytest.fixture
def history() -> None:
    # Two days ago: only the 7d window sees it.
    decision(timedelta(days=2), [("old", "ok", "", 900.0)])
    # Three hours ago: 24h and 7d.
    decision(timedelta(hours=3), [("a", "error", "unavailable", 100.0), ("b", "ok", "", 40.0)],
             fallback_used=True)  # fmt: skip
    # The last hour.
    for latency in (10.0, 20.0, 30.0, 40.0):
        decision(timedelta(minutes=5), [("a", "ok", "", latency)])
    decision(timedelta(minutes=1), [("a", "skipped", "circuit_open", 0.0), ("b", "ok", "", 50.0)],
             fallback_used=True)  # fmt: skip
    decision(timedelta(minutes=1), [("a", "skipped", "circuit_open", 0.0),
                                    ("b", "skipped", "missing_key", 0.0), ("mock", "ok", "", 1.0)],
             fallback_used=True)  # fmt: skip


def test_windows_count_what_they_should(history):
    check_windows()


@pytest.mark.services
def test_windows_on_postgresql(history):
    """The same figures from PostgreSQL's percentile_cont (services suite)."""
    from django.db import connection

    assert connection.vendor == "postgresql"
    check_windows()


def check_windows() -> None:
    hour = dashboard.build("1h")
    assert hour.summary == {
        "requests": 6,
        "fallbacks": 2,
        "fallback_rate": pytest.approx(2 / 6),
        "failures": 0,
        "failure_rate": 0.0,
    }
    assert hour.outcomes == {"a": {"ok": 4, "skipped": 2}, "b": {"ok": 1, "skipped": 1},
                             "mock": {"ok": 1}}  # fmt: skip
    assert hour.latency["a"] == (25.0, pytest.approx(38.5))
    assert hour.skips == [("circuit_open", 2), ("missing_key", 1)]
    day = dashboard.build("24h")
    assert day.summary["requests"] == 7
    assert day.outcomes["a"] == {"error": 1, "ok": 4, "skipped": 2}
    assert "old" not in day.outcomes
    week = dashboard.build("7d")
    assert week.summary["requests"] == 8 and week.latency["old"] == (900.0, 900.0)
    assert dashboard.build("nonsense").window == "24h"


def test_empty_window():
    board = dashboard.build("1h")
    assert board.summary["requests"] == 0 and board.outcomes == {} and board.skips == []


DASHBOARD = "admin:llm_routing_dashboard"


def test_dashboard_page_renders_the_charts(admin_client, history):
    url = reverse(DASHBOARD)
    assert url == "/admin/llm_routing/routingdecision/dashboard/"
    html = admin_client.get(url, {"window": "1h"}).content.decode()
    dash = html[html.index('id="llmr-dashboard"') :]
    dash = dash[: dash.index("Explain a route</a>")]
    assert "Routing, last 1h" in dash
    assert '<strong class="llmr-requests">6</strong>' in dash
    assert '<strong class="llmr-fallbacks">2</strong><span>with a fallback (33.3 %)' in dash
    assert '<strong class="llmr-failures">0</strong>' in dash
    assert dash.count('class="llmr-stacked"') == 2 and dash.count('class="llmr-bars"') == 1
    assert "circuit open (circuit_open)" in dash and "Attempts by outcome" in dash
    assert "http://" not in dash.replace('xmlns="http://www.w3.org/2000/svg"', "")
    week = admin_client.get(url, {"window": "7d"}).content.decode()
    assert "Routing, last 7d" in week and ">old<" in week


def test_dashboard_needs_the_view_permission(client, django_user_model, history):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("staff", password="pw-staff-1", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_provider"))
    client.force_login(user)
    html = client.get(reverse("admin:app_list", args=["llm_routing"])).content.decode()
    assert "Routing dashboard" not in html
    assert client.get(reverse(DASHBOARD)).status_code == 403


def test_wide_windows_are_sampled_and_scaled(history, monkeypatch):
    # 8 decisions in 7 d; with a sample of 2 decisions (2 blocks of 1) it is "wide".
    monkeypatch.setattr(dashboard, "SAMPLE_DECISIONS", 2)
    monkeypatch.setattr(dashboard, "SAMPLE_BLOCKS", 2)
    part = dashboard.window_slice(timezone.now() - timedelta(days=7))
    assert part is not None and part.sampled and part.decisions == 2
    assert part.scale == pytest.approx(8 / 2)
    week = dashboard.build("7d")
    assert week.sampled_decisions == 2
    assert week.summary["requests"] == 8  # always exact
    total = sum(n for counts in week.outcomes.values() for n in counts.values())
    assert total % 4 == 0 and total > 0  # sample counts x 4
    monkeypatch.setattr(dashboard, "SAMPLE_DECISIONS", 20_000)
    assert dashboard.build("7d").sampled_decisions is None


def test_sampled_page_says_so(admin_client, history, monkeypatch):
    monkeypatch.setattr(dashboard, "SAMPLE_DECISIONS", 2)
    monkeypatch.setattr(dashboard, "SAMPLE_BLOCKS", 2)
    html = admin_client.get(reverse(DASHBOARD), {"window": "7d"}).content.decode()
    assert "estimated from a sample of 2 requests" in html


def test_admin_index_links_the_dashboard_at_its_top(admin_client):
    """On main the admin index was Django's own; the links sat at the app page's foot."""
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert html.index('id="llmr-admin-links"') < html.index('id="content-main"')
    assert f'href="{reverse(DASHBOARD)}"' in html
    assert f'href="{reverse("admin:llm_routing_circuits")}"' in html
    app = admin_client.get(reverse("admin:app_list", args=["llm_routing"])).content.decode()
    assert app.index('id="llmr-admin-links"') < app.index('id="content-main"')
    assert f'href="{reverse(DASHBOARD)}"' in app


def test_a_failed_request_counts_as_a_failure(admin_client):
    decision(timedelta(minutes=1), [("a", "error", "unavailable", 5.0)], status="error")
    decision(timedelta(minutes=1), [("a", "ok", "", 5.0)])
    assert dashboard.build("1h").summary["failures"] == 1
    html = admin_client.get(reverse(DASHBOARD), {"window": "1h"}).content.decode()
    assert '<strong class="llmr-failures">1</strong>' in html
    assert "llmr-figure-bad" in html


def test_spend_table_headers_are_words_with_the_raw_name_in_a_tooltip(admin_client, history):
    html = admin_client.get(reverse(DASHBOARD), {"window": "1h"}).content.decode()
    if 'id="llmr-spend-providers"' in html and "cost_usd" in html:
        assert 'title="cost_usd">Cost (USD)</th>' in html
    # Django's dashboard.css (th {width: 100%}) is not on the page.
    assert "admin/css/dashboard.css" not in html
