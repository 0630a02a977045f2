"""The newcomer's path through the admin in a real browser (Playwright + Debian's
chromium, as tests/test_browser.py): log in, the admin index with the routing links at
its top, the dashboard in the light and the dark colour scheme, a decision that failed,
explain with an empty form and a filled one. Screenshots go to ``$LLMR_SCREENSHOTS``
(default ``artifacts/screenshots/``); the ones shown in docs/admin.md are copied to
docs/img/ by hand after looking at them."""

from __future__ import annotations

from typing import Any

import pytest

from llm_routing.errors import UnavailableError
from llm_routing.models import RoutingDecision
from llm_routing.router import route
from llm_routing.types import AuditRequest

from . import test_browser as browser
from .conftest import make_chain, make_provider

# The browser fixtures of tests/test_browser.py, used here under the same names.
_allow_sync_orm_beside_playwright = browser._allow_sync_orm_beside_playwright
browser_type_launch_args = browser.browser_type_launch_args
browser_context_args = browser.browser_context_args
admin_page = browser.admin_page
shot = browser.shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOWN = UnavailableError("down", http_status=503)


def traffic(scripted: Any) -> None:
    """Three requests: one served by the primary, one failed over, one that failed."""
    make_chain("main", [make_provider("off", enabled=False), make_provider("a"),
                        make_provider("b")], is_default=True)  # fmt: skip
    scripted.scripts["a"] = ["ok", DOWN, DOWN, DOWN, DOWN, DOWN, DOWN]
    scripted.scripts["b"] = ["ok", DOWN, DOWN, DOWN]
    for _ in range(3):
        route(
            AuditRequest(task="summarize", input_text="hello", backstop=False),
            sleeper=lambda s: None,
        )


def text_colours(page: Any, selector: str) -> set[str]:
    colours: list[str] = page.eval_on_selector_all(
        selector, "els => els.map(e => getComputedStyle(e).fill)"
    )
    return set(colours)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_dashboard_reads_in_both_colour_schemes(
    admin_page: Any, scripted: Any, key_env: str, scheme: str
) -> None:
    page = admin_page
    traffic(scripted)
    page.emulate_media(color_scheme=scheme)
    page.goto(f"{page.base}/admin/")
    links = page.locator("#llmr-admin-links")
    assert links.is_visible()
    shot(page, f"admin-index-{scheme}")
    links.locator("text=Routing dashboard").click()
    page.wait_for_selector("#llmr-dashboard")
    page.click("text=last 1h")
    dashboard = page.locator("#llmr-dashboard")
    assert "Routing, last 1h" in dashboard.inner_text()
    assert page.inner_text(".llmr-failures") == "1"
    # Full width: the dashboard is not squeezed into the app list's column.
    width = page.evaluate("document.querySelector('#llmr-dashboard').clientWidth")
    room = page.evaluate("document.querySelector('#content').clientWidth")
    assert width > 0.9 * room and width > 700
    # Chart text is drawn in the page's text colour, in either scheme.
    body = page.evaluate("getComputedStyle(document.querySelector('#content')).color")
    assert text_colours(page, "#llmr-dashboard svg text") == {body}
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert body != background
    # Spend headers read on one line (Django's dashboard.css made them one letter wide).
    heights = page.eval_on_selector_all(
        "table.llmr-spend th", "els => els.map(e => e.getBoundingClientRect().height)"
    )
    assert heights and max(heights) < 40
    shot(page, f"dashboard-{scheme}", "#content")


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_a_failed_decision_reads_as_a_failure(
    admin_page: Any, scripted: Any, key_env: str, scheme: str
) -> None:
    page = admin_page
    traffic(scripted)
    page.emulate_media(color_scheme=scheme)
    failed = RoutingDecision.objects.exclude(status="ok").get()
    page.set_viewport_size({"width": 1500, "height": 760})
    page.goto(f"{page.base}/admin/llm_routing/routingdecision/")
    row = page.locator(f"#result_list tr:has(a[href*='/{failed.pk}/'])")
    assert "failed" in row.inner_text().lower()
    shot(page, f"decisions-{scheme}", "#result_list")
    page.goto(f"{page.base}/admin/llm_routing/routingdecision/{failed.pk}/change/")
    content = page.inner_text("#content")
    assert "Selected provider" not in content or "none" in content.lower()
    assert "no provider could answer" in content.lower()
    body = page.evaluate("getComputedStyle(document.querySelector('#content')).color")
    assert text_colours(page, "svg.llmr-timeline text") == {body}
    shot(page, f"decision-failed-{scheme}", "#content")


def test_explain_empty_then_filled(admin_page: Any, scripted: Any, key_env: str) -> None:
    page = admin_page
    traffic(scripted)
    page.goto(f"{page.base}/admin/")
    page.click("#llmr-admin-links >> text=Explain a route")
    page.wait_for_selector("form.llmr-explain-form")
    assert page.input_value("#id_task") == ""
    assert page.locator("label[for=id_force_provider]").inner_text() != "force_provider"
    page.click("input[value=Explain]")  # empty: the browser and the page say what is missing
    page.wait_for_url("**/explain/?*")  # the submitted page, not the one being left
    empty = page.wait_for_selector(".llmr-empty", state="visible")
    assert empty is not None and "Correct the field above" in empty.inner_text()
    shot(page, "explain-empty", "#content")
    page.fill("#id_task", "summarize")
    page.select_option("#id_chain", "main")
    page.click("input[value=Explain]")
    page.wait_for_selector("#llmr-candidates")
    rows = page.locator("#llmr-candidates tbody tr")
    assert "off" in rows.nth(0).inner_text() and "disabled" in rows.nth(0).inner_text()
    shot(page, "explain-filled", "#content")
