"""Each private seam's guard (llm_routing.seams): a simulated drift (the attribute
monkeypatched away or changed) makes the probe fail, the code at that seam takes
Django's (or the library's) own way, and the system check warns with the seam's id."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import asgiref.sync
import django
import httpcore
import httpx
import pytest
from django.core import checks
from django.core.handlers import base as handlers_base
from django.dispatch import Signal
from django.utils.deprecation import MiddlewareMixin
from rest_framework import serializers

from llm_routing import asgi, inline_middleware, seams
from llm_routing.api import base as api_base
from llm_routing.api import reuse
from llm_routing.checks import check_private_seams
from llm_routing.providers import base as providers_base

from .test_asgi_inline_middleware import _requests, _where_signals_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_probes() -> Iterator[None]:
    seams.reset()
    yield
    seams.reset()


def warned(code: str) -> bool:
    return f"llm_routing.{code}" in {m.id for m in check_private_seams()}


def test_every_seam_is_usable_with_the_pinned_versions() -> None:
    assert {s.code for s in seams.seams()} == {f"W02{i}" for i in range(9)}
    assert check_private_seams() == []
    assert not [m for m in checks.run_checks() if (m.id or "").startswith("llm_routing.W02")]


def test_every_seam_is_in_the_configuration_reference() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    assert [s.code for s in seams.seams() if f"`llm_routing.{s.code}`" not in text] == []


def test_the_warning_names_the_seam_and_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    class Moved:  # asgiref's SyncToAsync as asgi.py would see it after a rename
        thread_sensitive_context = asgiref.sync.SyncToAsync.thread_sensitive_context

    monkeypatch.setattr(asgi, "SyncToAsync", Moved)
    (message,) = check_private_seams()
    assert message.id == "llm_routing.W021" and message.level == checks.WARNING
    assert "context_to_thread_executor" in message.msg
    assert "through a thread" in (message.hint or "")


# --- asgi.py: W020-W023 ------------------------------------------------------------------


@pytest.mark.skipif(django.VERSION[:2] != (5, 2), reason="the copy is used on Django 5.2")
def test_w020_a_changed_handle_serves_with_djangos_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asgi, "COPIED_HANDLE_DIGESTS", frozenset({"0" * 64}))
    (response,), seen = _where_signals_run(monkeypatch, ("GET", "/no-such-page/"))
    assert response.status_code == 404
    assert seen == [("started", False), ("finished", False)]  # Django's: through threads
    assert warned("W020")


def test_w020_on_django_6_djangos_own_handle_is_used_without_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(django, "VERSION", (6, 1, 0, "final", 0))
    (response,), seen = _where_signals_run(monkeypatch, ("GET", "/no-such-page/"))
    assert response.status_code == 404
    assert seen == [("started", False), ("finished", False)]
    assert not warned("W020")


def test_w021_without_asgirefs_thread_context_the_end_goes_to_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Moved:  # asgiref's SyncToAsync as asgi.py would see it after a rename
        context_to_thread_executor: dict[Any, Any] = {}

    monkeypatch.setattr(asgi, "SyncToAsync", Moved)
    (response,), seen = _where_signals_run(monkeypatch, ("GET", "/no-such-page/"))
    assert response.status_code == 404
    if django.VERSION[:2] == (5, 2):
        assert seen == [("started", True), ("finished", False)]
    assert warned("W021")


def test_w022_without_live_receivers_signals_go_through_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(Signal, "_live_receivers")
    monkeypatch.setattr(Signal, "_live_receivers", lambda self, sender: [], raising=False)
    assert not asgi._loop_safe(Signal(), None)
    assert warned("W022")


def test_w023_without_import_string_in_the_handler_the_stock_middleware_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handlers_base, "import_string", _stock_import_string())
    handler = asgi.InlineMiddlewareASGIHandler()
    assert not _inline_classes(handler)
    assert warned("W023")


def _stock_import_string() -> Any:
    from django.utils.module_loading import import_string

    def moved(path: str) -> Any:  # Django's, but no longer the same object
        return import_string(path)

    return moved


def _inline_classes(handler: Any) -> list[type]:
    """The inline subclasses among the loaded middleware (walking the chain)."""
    found = []
    link = handler._middleware_chain  # each middleware wrapped by Django (functools.wraps)
    seen = set()
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link = getattr(link, "__wrapped__", link)
        if type(link) in inline_middleware.INLINE.values():
            found.append(type(link))
        link = getattr(link, "get_response", None)
    return found


def test_the_inline_classes_load_when_every_seam_is_there() -> None:
    assert len(_inline_classes(asgi.InlineMiddlewareASGIHandler())) == 7


# --- inline_middleware.py: W024, W025 ----------------------------------------------------


def test_w024_without_acall_the_stock_middleware_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(MiddlewareMixin, "__acall__")
    handler = asgi.InlineMiddlewareASGIHandler()
    assert not _inline_classes(handler)
    assert warned("W024")


def test_w024_the_stock_middleware_hops_per_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback is Django's behaviour: a hook per hop (seen with the seam gone)."""
    monkeypatch.setattr(inline_middleware, "inline_usable", lambda: False)
    (response,), hops = _requests(asgi.InlineMiddlewareASGIHandler(), ("GET", "/no-such/"))
    assert response.status_code == 404
    assert response.headers["x-frame-options"] == "DENY"
    assert sum(n for name, n in hops.items() if "process_re" in name) >= 7


def test_w025_without_the_storage_flags_messages_save_in_the_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.contrib.messages.storage.base import BaseStorage
    from django.http import HttpRequest

    original_init = BaseStorage.__init__

    def init(self: Any, request: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, request, *args, **kwargs)
        del self.added_new  # a Django that renamed the flag

    monkeypatch.setattr(BaseStorage, "__init__", init)
    middleware = inline_middleware.MessageMiddleware(lambda request: None)
    request = HttpRequest()
    assert middleware._may_do_io(request)  # the thread, as Django's
    assert warned("W025")


def test_w025_with_the_flags_an_untouched_storage_stays_on_the_loop() -> None:
    from django.contrib.messages.storage.cookie import CookieStorage
    from django.http import HttpRequest

    middleware = inline_middleware.MessageMiddleware(lambda request: None)
    request = HttpRequest()
    assert not middleware._may_do_io(request)
    request._messages = CookieStorage(request)  # what the middleware's request hook sets
    assert not middleware._may_do_io(request)
    request._messages.add(20, "saved")
    assert middleware._may_do_io(request)


# --- api/reuse.py: W026 ------------------------------------------------------------------


class Body(serializers.Serializer):
    n = serializers.IntegerField()


def test_w026_a_drf_that_caches_more_gets_a_new_serializer_per_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with reuse.reused(Body, {"n": 1}) as first:
        assert first.is_valid()
    with reuse.reused(Body, {"n": 2}) as second:
        assert second is first  # reused while the seam holds

    original = serializers.Serializer.is_valid

    def is_valid(self: Any, *args: Any, **kwargs: Any) -> bool:
        self._cached_request_state = self.initial_data  # a new cache in a future DRF
        return original(self, *args, **kwargs)

    monkeypatch.setattr(serializers.Serializer, "is_valid", is_valid)
    seams.reset()
    with reuse.reused(Body, {"n": 3}) as third:
        assert third is not first
        assert third.is_valid() and third.validated_data == {"n": 3}
    assert warned("W026")


# --- api/base.py: W027 -------------------------------------------------------------------


def test_w027_without_the_coroutine_marker_the_views_serve_their_sync_face(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llm_routing.api.views import AuditView

    assert isinstance(AuditView.as_view(), api_base.ServerMatchedView)
    monkeypatch.setattr(api_base, "_COROUTINE_MARKS", {})
    seams.reset()
    view = AuditView.as_view()
    assert not isinstance(view, api_base.ServerMatchedView)
    assert not asgiref.sync.iscoroutinefunction(view)
    assert warned("W027")


def test_w027_a_marker_asgiref_no_longer_reads_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(api_base, "_COROUTINE_MARKS", {"_not_the_marker": object()})
    assert seams.broken("W027") is not None

    async def on_a_loop() -> bool:
        def face(request: Any) -> None: ...

        return asgiref.sync.iscoroutinefunction(api_base.ServerMatchedView(face, face))

    assert asyncio.run(on_a_loop()) is False


def test_w027_first_probed_on_an_event_loop_still_finds_the_marker() -> None:
    """A uvicorn worker builds its URLconf at its first request, on its event loop, so
    the probe first runs there: it must not read "on a loop" as "outside one" (it did,
    and every API view of the shipped server served its sync face: a client that left
    a stream no longer closed the upstream request)."""
    from llm_routing.api.views import AuditView

    async def first_request() -> bool:
        seams.reset()
        return isinstance(AuditView.as_view(), api_base.ServerMatchedView)

    assert asyncio.run(first_request())
    assert seams.broken("W027") is None
    assert not warned("W027")


# --- providers/base.py: W028 -------------------------------------------------------------


def test_w028_without_the_lazy_timeout_read_the_body_timeout_applies_from_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = httpx.Request("POST", "http://127.0.0.1/", extensions={"timeout": {"read": 1.0}})
    response = httpx.Response(200, request=request)
    providers_base._set_body_read_timeout(response, 9.0)
    assert request.extensions["timeout"]["read"] == 9.0  # the seam holds: set after sending

    class Moved:  # an httpcore whose body read no longer reads the extension
        def _receive_response_body(self, request: Any) -> None: ...

    monkeypatch.setattr(httpcore, "HTTP11Connection", Moved)
    seams.reset()
    request.extensions["timeout"]["read"] = 1.0
    providers_base._set_body_read_timeout(response, 9.0)
    assert request.extensions["timeout"]["read"] == 1.0  # not touched
    assert warned("W028")
