"""The lean lane: ``/v1/*`` served without Django's request cycle (issue 23).

::

    # asgi.py
    from django.core.asgi import get_asgi_application
    from llm_routing.asgi import lane

    application = lane(get_asgi_application())

``lane(app)`` is an ASGI application, the shape of Channels' routers: an HTTP request
whose path is one of the app's OpenAI-style faces (:data:`LANE_ROUTES`: today
``/v1/chat/completions``, ``/v1/models``, ``/v1/responses``, ``/v1/messages``,
``/v1/messages/count_tokens`` and ``/v1/embeddings``, wherever the host mounted
``llm_routing.urls``) is served here; every other scope — ``/audit/``, the admin,
``/health/``, the host's own views, websockets — goes to ``app`` untouched. It also
answers the ASGI ``lifespan`` protocol (:func:`llm_routing.asgi.with_lifespan`).

**One implementation.** The lane calls the very view callable Django's URL table holds
for the path (``resolve(path).func``, the DRF view): the same authentication,
permissions, throttles, budgets, body limits, validation, router, records and error
envelopes, through the same functions. What it leaves out is Django's request cycle
around that call: the handler's ``get_response``, the ``MIDDLEWARE`` chain, URL
resolution per request and the ``request_started`` / ``request_finished`` signals.
The app's own per-request steps are done here instead: the ``django.request`` line of
a 4xx or 5xx answer (Django's ``log_response``, as its handler writes it), the request
id and the W3C ``traceparent`` (:class:`~llm_routing.middleware.RequestIdMiddleware`
wraps the view, as it does in ``MIDDLEWARE``), the budgets' end-of-request release
(:func:`llm_routing.budgets.forget`), and the database hygiene of every worker-thread
hop (``close_old_connections`` before and after, :func:`llm_routing.api.base.in_thread`;
the event loop's thread never holds a connection). docs/production.md says what a host
gives up there (its middleware does not run on ``/v1``) and what it gets.

**Disconnects.** As Django's ASGI handler does: the body is read whole first (a client
gone before that is dropped), then the view and the response run in one task while
another listens for ``http.disconnect``; a disconnect cancels the first, so a stream's
router sees the cancellation and records ``client_disconnected``.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import IO, Any

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.core.handlers.exception import response_for_exception
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.urls import NoReverseMatch, get_script_prefix, resolve, reverse
from django.utils.log import log_response

from .logging import bound_request_id

__all__ = ["LANE_ROUTES", "lane", "lane_paths", "register"]

logger = logging.getLogger("llm_routing.lane")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
View = Callable[[HttpRequest], Awaitable[HttpResponseBase]]

#: The URL names (in the ``llm_routing`` namespace) the lane serves: the OpenAI-style
#: faces. A new face registers its URL name with :func:`register`; the lane then serves
#: it through the view Django's URL table holds for it.
LANE_ROUTES: list[str] = [
    "chat-completions",
    "models",
    "responses",
    "messages",
    "messages-count-tokens",
    "embeddings",
]

_sniffio: Any
try:  # anyio's (and so httpcore's) way to learn the running async library
    import sniffio as _sniffio
except ImportError:  # anyio then asks asyncio itself
    _sniffio = None


def register(url_name: str) -> None:
    """Serve the URL named ``llm_routing:<url_name>`` on the lane too (a ``/v1`` face).
    Call it at import time (before the first request builds the path table)."""
    if url_name not in LANE_ROUTES:
        LANE_ROUTES.append(url_name)


def lane_paths() -> dict[str, View]:
    """Path (as Django sees ``path_info``) → the coroutine serving it: the URL table's
    view for that path wrapped in the request-id middleware. A name the host's URLconf
    does not include is left out (its requests go to Django, which answers 404)."""
    from .middleware import RequestIdMiddleware

    prefix = get_script_prefix()
    table: dict[str, View] = {}
    for name in LANE_ROUTES:
        try:
            url = reverse(f"llm_routing:{name}")
        except NoReverseMatch:
            logger.warning("The lane serves no %r: the URLconf does not include it.", name)
            continue
        path = "/" + url[len(prefix) :] if url.startswith(prefix) else url
        table[path] = RequestIdMiddleware(_as_coroutine(resolve(path).func))
    return table


def _as_coroutine(view: Callable[..., Any]) -> View:
    """The view's async face (on the event loop), or its sync one in a worker thread
    rendered there (a view with no async face, as ``GET /v1/models``)."""
    from .api.base import serve_in_thread

    async def call(request: HttpRequest) -> HttpResponseBase:
        if iscoroutinefunction(view):  # a ServerMatchedView answers this on the loop
            response: HttpResponseBase = await view(request)
            return response
        return await serve_in_thread(view, request)

    return call


def lane(app: ASGIApp) -> ASGIApp:
    """``app`` with ``/v1/*`` served on the lane (see the module doc) and the ASGI
    ``lifespan`` protocol answered."""
    from .asgi import with_lifespan

    table: dict[str, View] | None = None

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal table
        if scope["type"] == "http":
            if table is None:
                table = lane_paths()
            view = table.get(_path_info(scope))
            if view is not None:
                await _serve(view, scope, receive, send)
                return
        await app(scope, receive, send)

    return with_lifespan(application)


def _path_info(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


async def _read_body(receive: Receive) -> IO[bytes] | None:
    """The request body (spooled to disk past ``FILE_UPLOAD_MAX_MEMORY_SIZE``, as
    Django's handler does), or None when the client left before sending it all."""
    body = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            body.close()
            return None
        if "body" in message:
            body.write(message["body"])
        if not message.get("more_body", False):
            break
    body.seek(0)
    return body


async def _serve(view: View, scope: Scope, receive: Receive, send: Send) -> None:
    if _sniffio is not None:  # as llm_routing.asgi's handler: httpcore asks per socket call
        _sniffio.current_async_library_cvar.set("asyncio")
    body = await _read_body(receive)
    if body is None:
        return
    try:
        try:
            request: HttpRequest = ASGIRequest(scope, body)
        except Exception as exc:  # a malformed request line or header: Django's 400
            logger.warning("Bad request on the lane (%s).", type(exc).__name__)
            await _send_response(HttpResponseBadRequest(), send)
            return
        answer = asyncio.create_task(_answer(view, request, send))
        listen = asyncio.create_task(_disconnected(receive))
        _, pending = await asyncio.wait([answer, listen], return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()  # the client left: the view sees the cancellation
        for task in (listen, answer):  # the answer's own error, if any, last
            try:
                await task
            except asyncio.CancelledError:
                pass
    finally:
        body.close()


async def _answer(view: View, request: HttpRequest, send: Send) -> None:
    """The view's answer, sent; then the end of the request in the view's own context
    (the budgets' grant lives in a context variable the view set)."""
    from . import budgets

    try:
        try:
            request.get_host()  # ALLOWED_HOSTS, as CommonMiddleware checks it: else a 400
            response = await view(request)
        except Exception as exc:  # what Django's handler answers (400/500, logged, signal)
            response = response_for_exception(request, exc)
        if response.status_code >= 400:  # as Django's handler logs every answer it gives
            # ("Internal Server Error: /v1/…" at ERROR on django.request for a 5xx, a
            # WARNING for a 4xx; the path only, never the body), under the answer's
            # request id. Once: an answer from response_for_exception is logged already.
            with bound_request_id(response.get("X-Request-ID") or "-"):
                log_response(
                    "%s: %s",
                    response.reason_phrase,
                    request.path,
                    response=response,  # type: ignore[arg-type]  # a stream too, as Django's
                    request=request,
                )
        try:
            await _send_response(response, send)
        except OSError:  # the server's socket went away mid-send: nothing more to send
            logger.debug("The client went away while the lane sent the answer.")
    finally:
        budgets.forget()  # Django: its request_finished receiver


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _headers(response: HttpResponseBase) -> list[tuple[bytes, bytes]]:
    headers = [(k.encode("ascii"), v.encode("latin1")) for k, v in response.items()]
    for cookie in response.cookies.values():
        headers.append((b"Set-Cookie", cookie.output(header="").encode("ascii").strip()))
    return headers


async def _send_response(response: HttpResponseBase, send: Send) -> None:
    """The response as ASGI messages (Django's ``send_response``, with a
    ``Content-Length`` on a whole body, as its ``CommonMiddleware`` sets it)."""
    headers = _headers(response)
    if not response.streaming:
        assert isinstance(response, HttpResponse)
        content = response.content
        if not response.has_header("Content-Length"):
            headers.append((b"Content-Length", str(len(content)).encode("ascii")))
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        await send({"type": "http.response.body", "body": content})
        return
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    assert isinstance(response, StreamingHttpResponse)
    parts: AsyncIterator[bytes] = aiter(response)  # a sync iterator mapped, as Django's
    async with aclosing(parts):  # type: ignore[type-var]
        async for part in parts:
            if part:
                await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body"})
