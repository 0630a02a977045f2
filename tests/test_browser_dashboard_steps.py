"""The dashboard's Steps and Hedges panels in a real browser (Playwright + Debian's
chromium, as tests/test_browser.py), in the light and the dark colour scheme, with
traffic routed by the real router: a weighted step (scripted providers) and a hedging
chain on the fake upstream. Screenshots go to ``$LLMR_SCREENSHOTS``; the ones shown in
docs/admin.md are copied to docs/img/ by hand after looking at them."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from llm_routing import dashboard
from llm_routing.router import route
from llm_routing.types import AuditRequest

from . import test_browser as browser
from .test_admin_dashboard_steps import hedge_traffic, hedging, stepped
from .test_browser_newcomer import text_colours

_allow_sync_orm_beside_playwright = browser._allow_sync_orm_beside_playwright
browser_type_launch_args = browser.browser_type_launch_args
browser_context_args = browser.browser_context_args
admin_page = browser.admin_page
shot = browser.shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def colour(page: Any, selector: str, prop: str) -> str:
    return str(page.eval_on_selector(selector, f"e => getComputedStyle(e).{prop}"))


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_steps_and_hedges_panels_read_in_both_colour_schemes(
    admin_page: Any, scripted: Any, key_env: str, fake_upstream: Any, settings: Any, scheme: str
) -> None:
    page = admin_page
    stepped("main", {"oa-key1": 3.0, "oa-key2": 1.0}, after=("anthropic",))
    served: Counter[str] = Counter()
    for _ in range(24):
        routed = route(AuditRequest(task="summarize", input_text="hi"), sleeper=lambda s: None)
        served[routed.result.provider] += 1
    hedging(fake_upstream, "hedged", is_default=False)
    assert hedge_traffic(fake_upstream, settings, chain="hedged")["won"] == 1
    page.emulate_media(color_scheme=scheme)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{page.base}/admin/llm_routing/routingdecision/dashboard/?window=1h")
    steps = page.locator("#llmr-steps")
    text = steps.inner_text()
    assert "main, step 0: weighted — 24 answers served" in text
    rows = page.locator("#llmr-steps tbody tr")
    assert rows.count() == 2
    for i, name in enumerate(("oa-key1", "oa-key2")):
        cells = rows.nth(i).locator("td").all_inner_texts()
        share = f"{100 * served[name] / 24:.1f} %"
        configured = "75.0 %" if name == "oa-key1" else "25.0 %"
        assert cells[:5] == [name, str(served[name]), share, f"{3 if i == 0 else 1}", configured]
    # The bar's width is the served share, the line sits at the configured share.
    track = page.locator("#llmr-steps tbody tr").first.locator(".llmr-split")
    bar = track.locator(".llmr-split-bar").bounding_box()
    mark = track.locator(".llmr-split-mark").bounding_box()
    box = track.bounding_box()
    assert bar is not None and mark is not None and box is not None
    assert bar["width"] / box["width"] == pytest.approx(served["oa-key1"] / 24, abs=0.02)
    assert (mark["x"] + mark["width"] / 2 - box["x"]) / box["width"] == pytest.approx(
        0.75, abs=0.02
    )
    hedges = page.locator("#llmr-hedges tbody tr")
    assert hedges.count() == 1
    cells = hedges.first.locator("td").all_inner_texts()
    assert cells[:7] == ["hedged", "100 ms", "5", "3", "1", "1", "1"]
    assert cells[7] == "1 (out of attempts 1)" and cells[8] == "60.0 %"
    # Text in the page's colours, and the configured-share line in the text colour.
    body = colour(page, "#content", "color")
    background = colour(page, "body", "backgroundColor")
    assert body != background
    assert colour(page, "#llmr-steps caption", "color") == body
    assert colour(page, ".llmr-split-mark", "backgroundColor") == body
    assert colour(page, ".llmr-split", "backgroundColor") != colour(
        page, ".llmr-split-bar", "backgroundColor"
    )
    assert text_colours(page, "#llmr-dashboard svg text") == {body}
    outcomes = page.locator("#llmr-dashboard svg.llmr-stacked").first.text_content() or ""
    assert "hedge_lost" in outcomes and "hedge_skipped" in outcomes
    board = dashboard.build("1h")
    assert board.steps[0].served == 24 and board.hedges[0].hedged == 3
    shot(page, f"dashboard-steps-{scheme}", ".llmr-panels")
    shot(page, f"dashboard-full-{scheme}", "#content")


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_empty_panels_say_what_to_configure(admin_page: Any, scheme: str) -> None:
    page = admin_page
    page.emulate_media(color_scheme=scheme)
    page.goto(f"{page.base}/admin/llm_routing/routingdecision/dashboard/?window=1h")
    steps = page.inner_text("#llmr-steps")
    hedges = page.inner_text("#llmr-hedges")
    assert "No chain has a step of several entries" in steps and "strategy" in steps
    assert "No chain hedges. Set Hedge after ms on a Chain page" in hedges
    body = colour(page, "#content", "color")
    quiet = colour(page, ".llmr-empty-panel", "color")
    assert quiet != colour(page, "body", "backgroundColor") and quiet != ""
    assert body
    shot(page, f"dashboard-steps-empty-{scheme}", ".llmr-panels")
