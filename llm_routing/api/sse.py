"""Server-sent events framing for the streaming responses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from django.http import StreamingHttpResponse

__all__ = [
    "SSE_HEADERS",
    "SSENegotiationMixin",
    "aclose_events",
    "closing_events",
    "sse",
    "sse_response",
]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class SSENegotiationMixin:
    """For a view that streams: SSE clients send ``Accept: text/event-stream``, and a
    streamed answer is served in that type; anything else it answers (a 400, a 202, a
    JSON answer) falls back to JSON instead of DRF's 406."""

    def perform_content_negotiation(self, request: Any, force: bool = False) -> Any:
        if "text/event-stream" in request.META.get("HTTP_ACCEPT", ""):
            force = True
        return super().perform_content_negotiation(request, force=force)  # type: ignore[misc]


def sse(data: Any, *, event: str | None = None) -> bytes:
    """One SSE event; ``data`` is JSON-encoded unless it is already a string."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return (head + "".join(f"data: {line}\n" for line in payload.split("\n")) + "\n").encode()


def sse_response(frames: Iterable[bytes] | AsyncIterable[bytes]) -> StreamingHttpResponse:
    """A ``text/event-stream`` response of ``frames``: a sync iterator under WSGI, an
    async one under ASGI (each frame is sent as it comes, never buffered whole)."""
    response = StreamingHttpResponse(frames, content_type="text/event-stream")
    for name, value in SSE_HEADERS.items():
        response[name] = value
    return response


@asynccontextmanager
async def closing_events(events: AsyncIterator[Any]) -> AsyncIterator[AsyncIterator[Any]]:
    """``aclosing`` for the router's async stream: closed however the block ends (a
    client that went away cancels the block), so the decision is recorded now."""
    try:
        yield events
    finally:
        await aclose_events(events)


async def aclose_events(events: AsyncIterator[Any]) -> None:
    """Close the router's async stream (an async generator) now, not when collected."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()
