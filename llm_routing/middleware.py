"""``RequestIdMiddleware``: one request id per HTTP request (docs/observability.md).

A fresh UUID (a client's header is never trusted: the id keys the routing log) and the
incoming W3C ``traceparent`` (when OpenTelemetry is on; :mod:`llm_routing.tracing`),
bound for log records and spans (:func:`llm_routing.logging.bound_request_id`) while
the view runs and while a streamed body is produced; the API views hand the id to the
router as the routing request id; it goes back as ``X-Request-ID``. Put it first in
``MIDDLEWARE`` so every other middleware's log lines carry the id too. Sync and async
capable (under ASGI it never forces the chain into a thread).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse

from . import tracing
from .logging import bound_request_id

__all__ = ["RequestIdMiddleware"]


class RequestIdMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        request_id = str(uuid.uuid4())
        parent = tracing.extract(request.headers)  # an incoming traceparent, or None
        with bound_request_id(request_id), tracing.continued(parent):
            response = self.get_response(request)
        return _finish(response, request_id, parent)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        request_id = str(uuid.uuid4())
        parent = tracing.extract(request.headers)
        get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = self.get_response
        with bound_request_id(request_id), tracing.continued(parent):
            response = await get_response(request)
        return _finish(response, request_id, parent)


def _finish(response: HttpResponseBase, request_id: str, parent: object) -> HttpResponseBase:
    if isinstance(response, StreamingHttpResponse):
        content = response.streaming_content
        if response.is_async:
            assert isinstance(content, AsyncIterator)
            response.streaming_content = _abound(content, request_id, parent)
        else:
            assert isinstance(content, Iterator)  # a sync response's content
            response.streaming_content = _bound(content, request_id, parent)
    if not response.has_header("X-Request-ID"):
        response["X-Request-ID"] = request_id
    return response


def _bound(content: Iterator[bytes], request_id: str, parent: object) -> Iterator[bytes]:
    try:
        while True:
            with bound_request_id(request_id), tracing.continued(parent):
                chunk = next(content, None)
            if chunk is None:
                return
            yield chunk
    finally:
        close = getattr(content, "close", None)
        if close is not None:  # the client went away: the router's stream sees it
            with bound_request_id(request_id), tracing.continued(parent):
                close()


async def _abound(
    content: AsyncIterator[bytes], request_id: str, parent: object
) -> AsyncIterator[bytes]:
    try:
        while True:
            with bound_request_id(request_id), tracing.continued(parent):
                try:
                    chunk = await anext(content)
                except StopAsyncIteration:
                    return
            yield chunk
    finally:
        aclose = getattr(content, "aclose", None)
        if aclose is not None:
            with bound_request_id(request_id), tracing.continued(parent):
                await aclose()
