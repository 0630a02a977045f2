"""The admin in a real browser: Playwright driving Debian's chromium against
pytest-django's live server (a real HTTP server in this process, on 127.0.0.1).

Marked ``browser``. Without /usr/bin/chromium the tests are skipped locally and FAIL
under CI (``CI=true``): .ci/run installs chromium first, so nothing is skipped silently.
Each page is screenshotted into ``$LLMR_SCREENSHOTS`` (default ``artifacts/screenshots/``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from llm_routing.errors import UnavailableError
from llm_routing.models import Chain, Provider, RoutingDecision
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import OPEN, Circuit
from llm_routing.router import route
from llm_routing.types import AuditRequest

from .conftest import make_chain, make_provider

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = Path(os.environ.get("LLMR_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
SCREENSHOTS = Path(os.environ.get("LLMR_SCREENSHOTS") or "artifacts/screenshots")


@pytest.fixture(autouse=True, scope="module")
def _allow_sync_orm_beside_playwright() -> None:
    """Playwright's sync API keeps an asyncio loop marked running in the main thread
    from the first browser test to the end of the session, and Django then refuses every
    ORM call of that thread (test setup and teardown included), although all of them are
    plain synchronous code. This is the switch Django documents for exactly that case.
    It is set from the first browser test on — left set, since the loop outlives this
    module — and tests/conftest.py runs the browser tests last, so every other test runs
    without it (an async-unsafe call elsewhere still fails as it should)."""
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"


@pytest.fixture(scope="session")
def browser_type_launch_args() -> dict[str, Any]:
    """pytest-playwright launches Debian's chromium (no Playwright browser download)."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing (apt-get install chromium)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message}: browser tests cannot run in CI.")
        pytest.skip(message)
    return {"executable_path": str(CHROMIUM), "args": CHROMIUM_ARGS, "headless": True}


@pytest.fixture(scope="session")
def browser_context_args() -> dict[str, Any]:
    return {"viewport": {"width": 1200, "height": 760}}


def shot(page: Any, name: str, selector: str | None = None) -> None:
    """A screenshot of the page, or of one element of it."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = str(SCREENSHOTS / f"{name}.png")
    if selector:
        page.locator(selector).first.screenshot(path=path)
    else:
        page.screenshot(path=path)


@pytest.fixture
def admin_page(page: Any, live_server: Any, admin_user: Any) -> Iterator[Any]:
    page.set_default_timeout(15_000)
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")
    page.base = live_server.url
    yield page


def choose_provider(page: Any, row: str, name: str) -> None:
    """Pick a provider in an inline row's autocomplete (select2) widget."""
    page.click(f"#{row} .select2-selection")
    page.fill(".select2-container--open .select2-search__field", name)
    page.click(f".select2-results__option:text-is('{name}')")


def add_provider(page: Any, name: str) -> None:
    page.goto(f"{page.base}/admin/llm_routing/provider/add/")
    page.fill("#id_name", name)
    page.select_option("#id_kind", "mock")
    page.fill("#id_model", f"{name}-model")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")


def entry_order(page: Any) -> list[str]:
    """Provider names of the saved inline rows, top to bottom."""
    selects = ".llmr-chain-entries tr.has_original select[name$='-provider']"
    names: list[str] = page.eval_on_selector_all(
        selects, "els => els.map(e => e.options[e.selectedIndex].text)"
    )
    return names


def exported_entries(chain: str) -> list[Any]:
    out = StringIO()
    call_command("llm_routing_export", stdout=out)
    return list(tomllib.loads(out.getvalue())["chains"][chain]["entries"])


def test_create_providers_and_chain_then_drag_to_reorder(admin_page: Any) -> None:
    page = admin_page
    add_provider(page, "alpha")
    add_provider(page, "beta")
    shot(page, "providers")
    page.goto(f"{page.base}/admin/llm_routing/chain/add/")
    page.fill("#id_name", "main")
    choose_provider(page, "entries-0", "alpha")
    page.click(".llmr-chain-entries .add-row a")
    assert page.input_value("#id_entries-1-position") == "1"  # the next free position
    choose_provider(page, "entries-1", "beta")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    assert entry_order(page) == ["alpha", "beta"]

    page.drag_and_drop("#entries-1 .llmr-drag", "#entries-0", target_position={"x": 20, "y": 3})
    assert page.input_value("#id_entries-1-position") == "0"
    assert page.input_value("#id_entries-0-position") == "1"
    shot(page, "chain-dragged", ".llmr-chain-entries")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    assert entry_order(page) == ["beta", "alpha"]
    shot(page, "chain", ".llmr-chain-entries")
    assert exported_entries("main") == ["beta", "alpha"]
    page.goto(f"{page.base}/admin/llm_routing/chain/")
    assert "beta → alpha" in page.inner_text("#result_list")


def test_one_way_to_order_and_drag_delete_add_in_one_save(admin_page: Any) -> None:
    """Positions are hidden (drag is the one way to order). Dragging a row while ticking
    Delete on another and adding a row saves in one go: on main the blank extra row's
    position was rewritten, so Django answered "This field is required." for it."""
    page = admin_page
    providers = [Provider.objects.create(name=n, kind="mock", model="m") for n in "abcd"]
    chain = make_chain("main", providers[:3])
    page.goto(f"{page.base}/admin/llm_routing/chain/{chain.pk}/change/")
    assert page.locator(".llmr-chain-entries input[name$='-position']:visible").count() == 0
    assert "Position" not in page.inner_text(".llmr-chain-entries thead")
    assert page.locator(".llmr-chain-entries td.original p:visible").count() == 0
    # c to the top, b deleted, the blank extra row left alone.
    page.drag_and_drop("#entries-2 .llmr-drag", "#entries-0", target_position={"x": 20, "y": 3})
    page.check("#id_entries-1-DELETE")
    shot(page, "chain-drag-delete", ".llmr-chain-entries")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    assert page.locator(".errorlist").count() == 0
    assert entry_order(page) == ["c", "a"]
    assert exported_entries("main") == ["c", "a"]
    # Drag + delete + a new row (Add another, then the provider) in one save.
    page.click(".llmr-chain-entries .add-row a")
    choose_provider(page, "entries-3", "d")
    page.drag_and_drop("#entries-1 .llmr-drag", "#entries-0", target_position={"x": 20, "y": 3})
    page.check("#id_entries-0-DELETE")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    assert page.locator(".errorlist").count() == 0
    assert exported_entries("main") == ["a", "d"]
    assert entry_order(page) == ["a", "d"]
    shot(page, "chain-saved", ".llmr-chain-entries")


def test_explain_shows_the_disabled_primary_skipped(
    admin_page: Any, scripted: Any, key_env: str
) -> None:
    page = admin_page
    make_chain(
        "main", [make_provider("primary", enabled=False), make_provider("backup")], is_default=True
    )
    chain = Chain.objects.get(name="main")
    page.goto(f"{page.base}/admin/llm_routing/chain/{chain.pk}/change/")
    page.click("text=Explain a request routed to this chain")
    page.fill("#id_task", "summarize")
    page.click("input[value=Explain]")
    rows = page.locator("#llmr-candidates tbody tr")
    first, second = rows.nth(0).inner_text(), rows.nth(1).inner_text()
    assert "primary" in first and "skip" in first and "disabled" in first
    assert "backup" in second and "would try" in second
    shot(page, "explain", "#content")
    assert scripted.calls == []


def test_failover_decision_shows_two_bars(admin_page: Any, scripted: Any, key_env: str) -> None:
    page = admin_page
    make_chain("main", [make_provider("primary"), make_provider("backup")], is_default=True)
    scripted.scripts["primary"] = [UnavailableError("down", http_status=503)]
    route(AuditRequest(task="summarize", input_text="hello"), sleeper=lambda s: None)
    decision = RoutingDecision.objects.get()
    page.goto(f"{page.base}/admin/llm_routing/routingdecision/{decision.pk}/change/")
    bars = page.locator("svg.llmr-timeline g.llmr-bar")
    assert bars.count() == 2
    assert page.locator("svg.llmr-timeline g.llmr-served").count() == 1
    assert page.locator("svg.llmr-timeline .llmr-retry").count() == 2
    shot(page, "decision-timeline", ".field-timeline")


def test_reset_an_open_circuit_and_health_agrees(
    admin_page: Any, scripted: Any, key_env: str
) -> None:
    page = admin_page
    make_provider("primary")
    now = breaker.store.clock()
    breaker.store.save(
        Circuit(
            provider="primary", model="primary-model", state=OPEN, failures=3, level=1,
            opened_at=now, open_until=now + 300, last_error_at=now,
            last_error_category="unavailable", last_http_status=503,
        )
    )  # fmt: skip

    def health() -> str:
        body = page.request.get(f"{page.base}/health/").json()
        (primary,) = [p for p in body["providers"] if p["name"] == "primary"]
        return str(primary["health"]["state"])

    assert health() == "open"
    page.goto(f"{page.base}/admin/llm_routing/provider/")
    page.click("text=Circuit breakers")
    row = page.locator("tr.llmr-circuit-row[data-provider=primary]")
    assert "open" in row.inner_text() and "unavailable (503)" in row.inner_text()
    shot(page, "circuits", "#content")
    row.locator("button[value=reset]").click()
    page.wait_for_selector(".messagelist .success")
    assert "closed" in page.locator("tr.llmr-circuit-row[data-provider=primary]").inner_text()
    assert health() == "closed"


def test_dashboard_renders_its_charts(admin_page: Any, scripted: Any, key_env: str) -> None:
    page = admin_page
    make_chain(
        "main", [make_provider("off", enabled=False), make_provider("a"), make_provider("b")],
        is_default=True,
    )  # fmt: skip
    down = UnavailableError("down", http_status=503)
    scripted.scripts["a"] = ["ok", down, down, down, "ok"]  # the 2nd request fails over
    for _ in range(3):
        route(AuditRequest(task="summarize", input_text="hello"), sleeper=lambda s: None)
    page.goto(f"{page.base}/admin/llm_routing/routingdecision/dashboard/?window=1h")
    dashboard = page.locator("#llmr-dashboard")
    assert "Routing, last 1h" in dashboard.inner_text()
    assert dashboard.locator("svg.llmr-stacked").count() == 2
    assert dashboard.locator("svg.llmr-bars").count() == 1
    assert dashboard.locator("svg rect").count() >= 4
    assert "disabled" in dashboard.inner_text()
    shot(page, "dashboard", "#llmr-dashboard")
