"""``RequestIdMiddleware``: one request id per HTTP request (docs/observability.md).

A fresh UUID (a client's header is never trusted: the id keys the routing log) and the
incoming W3C ``traceparent`` (when OpenTelemetry is on; :mod:`llm_routing.tracing`),
bound for log records and spans (:func:`llm_routing.logging.bound_request_id`) while
the view runs and while a streamed body is produced; the API views hand the id to the
router as the routing request id; it goes back as ``X-Request-ID``. Put it first in ``MIDDLEWARE``
so every other middleware's log lines carry the id too.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator

from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse

from . import tracing
from .logging import bound_request_id

__all__ = ["RequestIdMiddleware"]


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        request_id = str(uuid.uuid4())
        parent = tracing.extract(request.headers)  # an incoming traceparent, or None
        with bound_request_id(request_id), tracing.continued(parent):
            response = self.get_response(request)
        if isinstance(response, StreamingHttpResponse) and not response.is_async:
            content = response.streaming_content
            assert isinstance(content, Iterator)  # a sync response's content
            response.streaming_content = _bound(content, request_id, parent)
        if not response.has_header("X-Request-ID"):
            response["X-Request-ID"] = request_id
        return response


def _bound(content: Iterable[bytes], request_id: str, parent: object) -> Iterator[bytes]:
    chunks = iter(content)
    try:
        while True:
            with bound_request_id(request_id), tracing.continued(parent):
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:  # the client went away: the router's stream sees it
            with bound_request_id(request_id), tracing.continued(parent):
                close()
