"""The ASGI application wrapper for serving the routing API: ``with_lifespan(app)``.

Django's ASGI handler refuses the ``lifespan`` protocol, so a server has nowhere to say
"this worker stops". This wrapper answers it: at shutdown, on the worker's own event
loop, the adapters' pooled async HTTP clients are closed
(``llm_routing.providers.registry.aclose_all``), so nothing warns about an unclosed
client and no socket outlives its loop. Every
other scope goes to the wrapped application unchanged::

    # asgi.py
    from django.core.asgi import get_asgi_application
    from llm_routing.asgi import with_lifespan

    application = with_lifespan(get_asgi_application())
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import django
from asgiref.sync import SyncToAsync, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.dispatch import Signal
from django.http.response import HttpResponseBase
from django.urls import set_script_prefix
from django.utils import module_loading

from . import seams
from .lane import lane  # the lean lane for /v1/* (issue 23): llm_routing/lane.py

__all__ = [
    "InlineMiddlewareASGIHandler",
    "close_async_clients",
    "get_asgi_application",
    "lane",
    "with_lifespan",
]

logger = logging.getLogger("llm_routing.asgi")

_sniffio: Any
try:  # anyio's (and so httpcore's) way to learn the running async library
    import sniffio as _sniffio
except ImportError:  # anyio then asks asyncio itself
    _sniffio = None

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def close_async_clients() -> None:
    """Close every pooled adapter and its async HTTP clients (this event loop's)."""
    from .providers import registry  # not at import: asgi.py imports this before setup

    await registry.aclose_all()


def with_lifespan(app: ASGIApp) -> ASGIApp:
    """``app`` with the ASGI ``lifespan`` protocol answered (see the module doc)."""

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await close_async_clients()
                except Exception as exc:  # shutting down anyway: say so, never hang
                    logger.warning(
                        "Closing the async HTTP clients failed (%s).", type(exc).__name__
                    )
                await send({"type": "lifespan.shutdown.complete"})
                return

    return application


# --- the private seams this module uses, each with its guard (llm_routing.seams) ---------

#: SHA-256 of the source of Django's ``ASGIHandler.handle`` that
#: :meth:`InlineMiddlewareASGIHandler.handle` copies (Django 5.2.x). Django 6.0 rewrote
#: ``handle`` around a TaskGroup: on Django 6 the handler serves with Django's own
#: ``handle`` by design (the middleware still runs inline), and on a 5.2 release whose
#: ``handle`` differs from the copy it does the same with warning W020.
COPIED_HANDLE_DIGESTS = frozenset(
    {"98faeb5bef800331e6a8002fbc96b30e4122a23438ae45a047190a531ea11323"}  # 5.2.x
)
_HANDLER_STEPS = ("read_body", "create_request", "run_get_response", "send_response")


def _copied_for_this_django() -> bool:
    """The copy is of Django 5.2's ``handle``: it is only ever used on 5.2."""
    return django.VERSION[:2] == (5, 2)


@seams.register(
    "W020",
    "Django's ASGIHandler.handle being the 5.2 one llm_routing.asgi copies",
    "requests are served by Django's own ASGIHandler.handle (request_started and "
    "request_finished through a thread each)",
)
def _probe_handle() -> str | None:
    if not _copied_for_this_django():
        return None  # Django 6: Django's own handle, by design (not a drift)
    missing = [n for n in (*_HANDLER_STEPS, "listen_for_disconnect") if not hasattr(ASGIHandler, n)]
    if missing:
        return f"ASGIHandler has no {', '.join(missing)}"
    if seams.source_digest(ASGIHandler.handle) not in COPIED_HANDLE_DIGESTS:
        return f"Django {django.get_version()}'s ASGIHandler.handle differs from the copy"
    return None


@seams.register(
    "W021",
    "asgiref's SyncToAsync.thread_sensitive_context and context_to_thread_executor",
    "every request's end (request_finished, response.close) goes through a thread",
)
def _probe_thread_context() -> str | None:
    context = getattr(SyncToAsync, "thread_sensitive_context", None)
    executors = getattr(SyncToAsync, "context_to_thread_executor", None)
    if not callable(getattr(context, "get", None)):
        return "SyncToAsync.thread_sensitive_context is not a context variable"
    if not hasattr(executors, "__contains__"):
        return "SyncToAsync.context_to_thread_executor is not a mapping"
    return None


@seams.register(
    "W022",
    "django.dispatch.Signal._live_receivers",
    "request_started and request_finished are sent through a thread, as Django does",
)
def _probe_live_receivers() -> str | None:
    probe = Signal()

    def receiver(**kwargs: Any) -> None: ...

    probe.connect(receiver, weak=False)
    found = probe._live_receivers(None)
    if not (isinstance(found, tuple) and len(found) == 2 and list(found[0]) == [receiver]):
        return "Signal._live_receivers(sender) no longer answers (sync, async) receivers"
    return None


@seams.register(
    "W023",
    "django.core.handlers.base.import_string (swapped while the handler loads MIDDLEWARE)",
    "the handler loads Django's stock middleware (a thread hop per hook)",
)
def _probe_import_string() -> str | None:
    if getattr(base, "import_string", None) is not module_loading.import_string:
        return "django.core.handlers.base no longer imports import_string"
    if "import_string(" not in inspect.getsource(BaseHandler.load_middleware):
        return "BaseHandler.load_middleware no longer calls import_string"
    return None


#: ``request_started`` / ``request_finished`` receivers that do no blocking I/O on the
#: event loop: the database's close_old_connections and reset_queries (the loop's thread
#: holds no connection: Django refuses the ORM there), closing the caches (per async
#: context, as Django's does), the URLconf reset, and this app's budget grant cleanup.
LOOP_SAFE_RECEIVERS = frozenset(
    {
        "django.db.close_old_connections",
        "django.db.reset_queries",
        "django.core.cache.close_caches",
        "django.core.handlers.base.reset_urlconf",
        "llm_routing.budgets._on_request_finished",
    }
)


def _loop_safe(signal: Signal, sender: Any) -> bool:
    """Every live receiver of ``signal`` is in :data:`LOOP_SAFE_RECEIVERS`."""
    if not seams.available("W022"):
        return False
    try:
        sync_receivers, async_receivers = signal._live_receivers(sender)
    except Exception:  # a Django whose private API moved: Django's own (threaded) way
        return False
    return not async_receivers and all(
        f"{getattr(r, '__module__', '')}.{getattr(r, '__qualname__', '')}" in LOOP_SAFE_RECEIVERS
        for r in sync_receivers
    )


def _request_thread_used() -> bool:
    """Whether this request ran sync code in its own thread (Django's per-request
    ``ThreadSensitiveContext``: a sync view, a middleware hook, a session save): its
    database connections live in that thread and are closed there, so the end of the
    request goes there too."""
    if not seams.available("W021"):
        return True  # cannot tell: Django's own way (a thread)
    context = SyncToAsync.thread_sensitive_context.get(None)
    return context is None or context in SyncToAsync.context_to_thread_executor


class InlineMiddlewareASGIHandler(ASGIHandler):
    """Django's ASGI handler with two changes that keep a request on the event loop:

    * it loads :mod:`llm_routing.inline_middleware`'s subclasses in place of Django's
      stock middleware named in ``MIDDLEWARE``: their hooks run on the loop instead of
      hopping, twice each, to a thread;
    * ``request_started`` and ``request_finished`` (sent by ``response.close()``) run
      inline when every receiver is in :data:`LOOP_SAFE_RECEIVERS` and the request used
      no per-request thread; Django starts a thread per request for them otherwise
      (measured: docs/benchmarks.md). Any other receiver, or a request that ran sync
      code in its thread (a sync view, the admin), gets Django's own handling.

    Each change stays behind its guard (:mod:`llm_routing.seams`, W020-W023): a Django
    or asgiref whose internals moved gets Django's own behaviour at that step, and a
    system-check warning.
    """

    def load_middleware(self, is_async: bool = False) -> None:
        from .inline_middleware import INLINE, inline_usable

        if not (seams.available("W023") and inline_usable()):
            super().load_middleware(is_async=is_async)  # Django's stock middleware
            return
        stock = getattr(base, "import_string")  # noqa: B009

        def import_inline(path: str) -> Any:
            return INLINE.get(path) or stock(path)

        setattr(base, "import_string", import_inline)  # noqa: B010 - startup, one thread
        try:
            super().load_middleware(is_async=is_async)
        finally:
            setattr(base, "import_string", stock)  # noqa: B010

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Django 5.2's ``ASGIHandler.handle`` (same steps, same order), with the two
        signals sent by :meth:`_started` and :meth:`_close`.

        It also says once per request that this is asyncio (sniffio's context variable,
        as ``anyio.run`` sets it): httpcore asks anyio which library runs on every
        socket read and write, and sniffio otherwise finds out by asking asyncio each
        time (measured: docs/benchmarks.md)."""
        if _sniffio is not None:
            _sniffio.current_async_library_cvar.set("asyncio")
        if not (_copied_for_this_django() and seams.available("W020")):
            await super().handle(scope, receive, send)
            return
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        await self._started(scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            assert error_response is not None  # Django's create_request: one of the two
            body_file.close()
            await self.send_response(error_response, send)
            await self._close(error_response)
            return

        async def process_request(request: Any, send: Send) -> HttpResponseBase:
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client disconnected during send_response
            return response

        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request(request, send)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass  # a client disconnect
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()  # views may handle the cancellation
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            if _loop_safe(signals.request_finished, self.__class__) and not (
                _request_thread_used()
            ):
                signals.request_finished.send(sender=self.__class__)
            else:
                await signals.request_finished.asend(sender=self.__class__)
        else:
            if response is not None:
                await self._close(response)
        body_file.close()

    async def _started(self, scope: Scope) -> None:
        if _loop_safe(signals.request_started, self.__class__):
            signals.request_started.send(sender=self.__class__, scope=scope)
        else:
            await signals.request_started.asend(sender=self.__class__, scope=scope)

    async def _close(self, response: HttpResponseBase) -> None:
        """``response.close()`` (it sends ``request_finished``), inline when safe."""
        sender = getattr(response, "_handler_class", self.__class__)
        if _loop_safe(signals.request_finished, sender) and not _request_thread_used():
            response.close()
        else:
            await sync_to_async(response.close)()


def get_asgi_application() -> ASGIApp:
    """:func:`django.core.asgi.get_asgi_application` with the inline middleware and the
    lifespan protocol answered (what the demo project's ``asgi.py`` serves)."""
    django.setup(set_prefix=False)
    return with_lifespan(InlineMiddlewareASGIHandler())
