"""Server-sent events framing for the streaming responses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from django.http import StreamingHttpResponse

from ..types import RouterStreamEvent, StreamChunk

__all__ = [
    "SSE_HEADERS",
    "EventFrames",
    "SSENegotiationMixin",
    "aclose_events",
    "aevent_frames",
    "afirst_event",
    "closing_events",
    "routed_stream_response",
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


def routed_stream_response(
    frames: Iterable[bytes] | AsyncIterable[bytes], request_id: str, first: RouterStreamEvent
) -> StreamingHttpResponse:
    """:func:`sse_response` of a routed stream, with ``X-Request-ID`` and, when the first
    event is a chunk, the ``X-LLM-Provider`` that is serving it."""
    response = sse_response(frames)
    response["X-Request-ID"] = request_id
    if isinstance(first, StreamChunk):
        response["X-LLM-Provider"] = first.provider
    return response


class EventFrames(Iterator[bytes]):
    """The frames of the router's sync stream, for ``StreamingHttpResponse`` (which
    calls ``close()`` when the response ends or the client goes away): ``close()``
    closes the router's stream explicitly, so its decision is recorded then. A class,
    not a generator: dropped unclosed, it leaves the router's stream to its own
    finalizer (llm_routing.effects.SyncStream), which never writes from there."""

    def __init__(
        self,
        events: Iterator[Any],
        to_frames: Callable[[Any], Iterable[bytes]],
        head: Iterable[Any] = (),
    ) -> None:
        self._events = events
        self._to_frames = to_frames
        self._head = iter(head)
        self._pending: Iterator[bytes] = iter(())

    def __iter__(self) -> EventFrames:
        return self

    def __next__(self) -> bytes:
        while True:
            frame = next(self._pending, None)
            if frame is not None:
                return frame
            event = next(self._head, None)
            if event is None:
                event = next(self._events)  # StopIteration ends the frames
            self._pending = iter(self._to_frames(event))

    def close(self) -> None:
        close = getattr(self._events, "close", None)
        if close is not None:
            close()


@asynccontextmanager
async def closing_events(events: AsyncIterator[Any]) -> AsyncIterator[AsyncIterator[Any]]:
    """``aclosing`` for the router's async stream: closed however the block ends (a
    client that went away cancels the block), so the decision is recorded now."""
    try:
        yield events
    finally:
        await aclose_events(events)


async def afirst_event(events: AsyncIterator[Any]) -> Any:
    """The first event of the router's async stream; if reading it is cancelled (the
    client went away) or fails, the stream is closed first, so its decision is
    recorded now."""
    try:
        return await anext(events)
    except BaseException:
        await aclose_events(events)
        raise


async def aclose_events(events: AsyncIterator[Any]) -> None:
    """Close the router's async stream (an async generator) now, not when collected."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


async def aevent_frames(
    events: AsyncIterator[Any],
    to_frames: Callable[[Any], Iterable[bytes]],
    head: Iterable[Any] = (),
) -> AsyncIterator[bytes]:
    """:class:`EventFrames` for the router's async stream: the frames of ``head`` (the
    events already read), then of each event as it comes, in :func:`closing_events`."""
    async with closing_events(events):
        for event in head:
            for frame in to_frames(event):
                yield frame
        async for event in events:
            for frame in to_frames(event):
                yield frame
