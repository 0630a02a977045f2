"""The demo project's ASGI application loads Django's stock middleware as
llm_routing.inline_middleware's subclasses: their hooks run on the event loop, not in
a thread hop each, and they still do their job (headers, CSRF, sessions)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asgiref.sync
import django
import httpx
import pytest

from llm_routing.asgi import InlineMiddlewareASGIHandler

pytestmark = pytest.mark.django_db(transaction=True)


def _requests(handler: Any, *calls: tuple[str, str]) -> tuple[list[httpx.Response], Counter]:
    hops: Counter[str] = Counter()
    original = asgiref.sync.SyncToAsync.__call__

    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        hops[getattr(self.func, "__qualname__", repr(self.func))] += 1
        return await original(self, *args, **kwargs)

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=handler)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            return [await c.request(method, path) for method, path in calls]

    asgiref.sync.SyncToAsync.__call__ = counted  # type: ignore[method-assign]
    try:
        return asyncio.run(run()), hops
    finally:
        asgiref.sync.SyncToAsync.__call__ = original  # type: ignore[method-assign]


def test_no_middleware_hook_hops_to_a_thread_and_headers_are_still_set() -> None:
    # A request that never touches the session (as an API call with a token).
    (response,), hops = _requests(InlineMiddlewareASGIHandler(), ("GET", "/no-such-page/"))
    assert response.status_code == 404
    # What Django's SecurityMiddleware and XFrameOptionsMiddleware add, still added.
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert not [name for name in hops if "process_re" in name]


def test_djangos_own_handler_hops_for_every_hook() -> None:
    """The control: the stock ASGI handler hops per hook (what the subclasses remove)."""
    from django.core.handlers.asgi import ASGIHandler

    (response,), hops = _requests(ASGIHandler(), ("GET", "/no-such-page/"))
    assert response.status_code == 404
    assert sum(n for name, n in hops.items() if "process_re" in name) >= 7


def test_an_admin_page_that_reads_the_session_still_works() -> None:
    """The login page sets a CSRF cookie and a redirect reads the session: the session
    save runs in the thread, as Django's, never on the loop (it would raise there)."""
    responses, _ = _requests(
        InlineMiddlewareASGIHandler(), ("GET", "/admin/login/"), ("GET", "/admin/")
    )
    login, admin = responses
    assert login.status_code == 200 and "csrftoken" in login.headers.get("set-cookie", "")
    assert admin.status_code == 302 and "/admin/login/" in admin.headers["location"]


# --- request_started / request_finished -------------------------------------------------


def _where_signals_run(
    monkeypatch: pytest.MonkeyPatch, *calls: tuple[str, str], safe: bool = True
) -> tuple[list[httpx.Response], list[tuple[str, bool]]]:
    """Serve ``calls`` with a receiver on both request signals recording (signal, ran on
    the event loop); ``safe``: the receiver is declared loop-safe."""
    from django.core import signals

    from llm_routing import asgi

    seen: list[tuple[str, bool]] = []

    def on_the_loop() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    def started(**kwargs: Any) -> None:
        seen.append(("started", on_the_loop()))

    def finished(**kwargs: Any) -> None:
        seen.append(("finished", on_the_loop()))

    if safe:
        names = {f"{f.__module__}.{f.__qualname__}" for f in (started, finished)}
        monkeypatch.setattr(asgi, "LOOP_SAFE_RECEIVERS", asgi.LOOP_SAFE_RECEIVERS | names)
    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    try:
        responses, _ = _requests(InlineMiddlewareASGIHandler(), *calls)
    finally:
        signals.request_started.disconnect(started)
        signals.request_finished.disconnect(finished)
    return responses, seen


#: The inline signals come from the copy of Django 5.2's ``ASGIHandler.handle``; on Django
#: 6 the handler serves with Django's own (tests/test_seams.py, W020).
copied_handle = pytest.mark.skipif(
    django.VERSION[:2] != (5, 2), reason="the copied handle is Django 5.2's"
)


@copied_handle
def test_a_request_that_used_no_thread_sends_its_signals_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (response,), seen = _where_signals_run(monkeypatch, ("GET", "/no-such-page/"))
    assert response.status_code == 404
    assert seen == [("started", True), ("finished", True)]
    # No hop for the signals or the close; the 404 page and its log line go to the
    # shared pool (Django's thread_sensitive=False): no per-request thread at all.
    (again,), hops = _requests(InlineMiddlewareASGIHandler(), ("GET", "/no-such-page/"))
    assert again.status_code == 404
    assert set(hops) == {"response_for_exception", "log_response"}


@copied_handle
def test_a_request_that_ran_sync_code_in_its_thread_finishes_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The admin is sync: its view (and its connections) ran in the request's thread,
    # so request_finished (close_old_connections) must run in that thread too.
    (response,), seen = _where_signals_run(monkeypatch, ("GET", "/admin/login/"))
    assert response.status_code == 200
    assert seen == [("started", True), ("finished", False)]


def test_a_receiver_not_known_to_be_loop_safe_gets_djangos_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (response,), seen = _where_signals_run(monkeypatch, ("GET", "/no-such-page/"), safe=False)
    assert response.status_code == 404
    assert seen == [("started", False), ("finished", False)]


# --- CSRF_USE_SESSIONS (issue 22, finding 6a) --------------------------------------------


@pytest.mark.parametrize("handler", ["inline", "django"])
def test_csrf_in_the_session_serves_the_login_page_again(handler: str) -> None:
    """With the CSRF secret in the session, the second GET of the login page (session
    cookie sent) reads the session in CSRF's hooks: a database read, which must run in
    the thread as Django's does (it was a 500 SynchronousOnlyOperation on the loop)."""
    from django.core.handlers.asgi import ASGIHandler
    from django.test import override_settings

    app = InlineMiddlewareASGIHandler() if handler == "inline" else ASGIHandler()
    with override_settings(CSRF_USE_SESSIONS=True):
        responses, _ = _requests(app, ("GET", "/admin/login/"), ("GET", "/admin/login/"))
    first, second = responses
    assert first.status_code == 200 and "sessionid" in first.headers.get("set-cookie", "")
    assert second.status_code == 200
    assert 'name="csrfmiddlewaretoken"' in second.text
