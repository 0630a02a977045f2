"""Shared streaming machinery of the HTTP adapters: per-vendor SSE decoders and the
first-token / idle / overall timeouts of one stream.

SSE framing is httpx-sse's (:class:`httpx_sse.EventSource`); a vendor decoder
(:class:`StreamDecoder` subclass, one per wire format, living next to its adapter)
turns each event into text pieces and tool-call fragments and remembers the finish
reason, usage and model. Tool calls are assembled in one place for every vendor
(:meth:`StreamDecoder.start_tool_call` / :meth:`StreamDecoder.tool_arguments`): the
first fragment of a call carries its id and name, later ones pieces of its JSON
arguments, and :meth:`StreamDecoder.end` hands the complete calls to the StreamEnd —
a stream cut before its end never presents a half call.

Hand-written here, because no library has the semantics: the **stall watchdog**.
httpx applies one per-read socket timeout to a whole response body (httpcore takes
``extensions["timeout"]["read"]`` once, when the body starts), but a stream needs
three clocks: the row's ``first_token_timeout_s`` until the first text delta, then
``STREAM_IDLE_TIMEOUT_S`` between events, all inside the call's overall timeout. One
daemon thread (:class:`_Watchdog`) holds the next deadline of every open stream and,
when one passes, shuts that stream's socket down (httpcore's public
``network_stream`` response extension → ``get_extra_info("socket")``). The blocked
read wakes at once and the adapter raises :class:`ProviderTimeoutError`. The time a
stream spends suspended in its consumer (the router writing to a slow client) is not
upstream silence and does not count toward the idle timeout. The async path
(:meth:`~llm_routing.providers.base.HttpProvider.astream`) needs no watchdog: it waits
for each event under an ``asyncio`` timeout taken from the same clock
(:meth:`StreamClock.next_deadline`, :meth:`StreamClock.timed_out`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any

import httpx
from httpx_sse import ServerSentEvent

from ..errors import ProviderTimeoutError, ResponseError
from ..types import StreamEnd, ToolCall, ToolCallDelta, Usage, assemble_tool_calls
from .usage import reported_tokens

__all__ = ["MalformedEvent", "StreamClock", "StreamDecoder", "StreamItem"]

#: What one event yields: answer text, or a fragment of a tool call.
StreamItem = str | ToolCallDelta

logger = logging.getLogger("llm_routing.providers")


class MalformedEvent(Exception):
    """One SSE event that cannot be understood: skipped and logged (never its data)."""


class StreamDecoder:
    """Per-stream state of one vendor's SSE wire format.

    :meth:`feed` returns what one event carries (may be empty): text pieces and
    :class:`~llm_routing.types.ToolCallDelta` fragments, in order; it raises
    :class:`MalformedEvent` for an event it cannot read, or a ProviderError for an
    in-band error event. ``done`` is set by the vendor's explicit end marker
    (``[DONE]``, ``message_stop``); a body that simply ends is judged by
    ``finish_reason`` (:meth:`end`).
    """

    def __init__(self, *, strip_prefix: str = "") -> None:
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.done = False
        self.parts: list[str] = []
        # Whitespace cut from the end of a prefill the vendor would reject with it;
        # removed again from the start of the continuation (never duplicated).
        self._strip_prefix = strip_prefix
        # Tool calls by the vendor's key (OpenAI's ``index``, Anthropic's content block
        # index, a running count for Gemini) → their ordinal; and every fragment emitted.
        self._calls: dict[object, int] = {}
        self._tool_deltas: list[ToolCallDelta] = []

    def feed(self, event: ServerSentEvent) -> list[StreamItem]:
        raise NotImplementedError

    # --- tool calls -------------------------------------------------------------------
    def start_tool_call(
        self, key: object, *, id: str | None, name: str | None, arguments: str = ""
    ) -> ToolCallDelta:
        """The first fragment of a new call (``index`` counts calls in order of
        appearance; a missing id becomes ``call_<index>``)."""
        index = self._calls[key] = len(self._calls)
        delta = ToolCallDelta(
            index=index, id=id or f"call_{index}", name=name or "", arguments=arguments
        )
        self._tool_deltas.append(delta)
        return delta

    def has_tool_call(self, key: object) -> bool:
        return key in self._calls

    def tool_arguments(self, key: object, fragment: str) -> ToolCallDelta | None:
        """A later piece of the arguments of call ``key`` (None when empty)."""
        index = self._calls[key]
        if not fragment:
            return None
        delta = ToolCallDelta(index=index, arguments=fragment)
        self._tool_deltas.append(delta)
        return delta

    def tool_call_items(
        self, key: object, *, id: str | None, name: str | None, arguments: str | None
    ) -> list[StreamItem]:
        """OpenAI-style fragments: the first one of ``key`` starts the call, later ones
        add arguments (a repeated id or name is ignored)."""
        if key not in self._calls:
            return [self.start_tool_call(key, id=id, name=name, arguments=arguments or "")]
        delta = self.tool_arguments(key, arguments or "")
        return [delta] if delta is not None else []

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The calls assembled so far (arguments ``{}`` when none were sent)."""
        return assemble_tool_calls(self._tool_deltas)

    # --- helpers ----------------------------------------------------------------------
    @staticmethod
    def load(event: ServerSentEvent) -> dict[str, Any]:
        try:
            value = json.loads(event.data)
        except (ValueError, RecursionError):
            raise MalformedEvent from None
        if not isinstance(value, dict):
            raise MalformedEvent
        return value

    def tokens(self, *, input_tokens: object = None, output_tokens: object = None) -> None:
        """The counts a usage event reports (bounded: :func:`reported_tokens`)."""
        if (count := reported_tokens(input_tokens, field="input_tokens")) is not None:
            self.input_tokens = count
        if (count := reported_tokens(output_tokens, field="output_tokens")) is not None:
            self.output_tokens = count

    def emit(self, texts: list[str]) -> list[StreamItem]:
        """Record and return the non-empty pieces (after the prefill-whitespace fix)."""
        out: list[StreamItem] = []
        for text in texts:
            if self._strip_prefix:
                if text.startswith(self._strip_prefix):
                    text = text[len(self._strip_prefix) :]
                    self._strip_prefix = ""
                elif text:
                    self._strip_prefix = ""
            if text:
                self.parts.append(text)
                out.append(text)
        return out

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def end(self) -> StreamEnd | None:
        """The clean end when a finish reason was seen; None means the stream was cut.
        It carries the assembled tool calls; a call that never got a name is a
        malformed answer (ResponseError), never presented."""
        if self.finish_reason is None:
            return None
        calls = self.tool_calls
        if any(not call.name for call in calls):
            raise ResponseError("The provider streamed a tool call without a name.")
        usage = None
        if self.input_tokens is not None or self.output_tokens is not None:
            usage = Usage(
                input_tokens=self.input_tokens or 0, output_tokens=self.output_tokens or 0
            )
        return StreamEnd(
            finish_reason=self.finish_reason, usage=usage, model=self.model, tool_calls=calls
        )


class StreamClock:
    """The three deadlines of one stream, enforced by the shared watchdog."""

    def __init__(self, *, first_token_s: float, idle_s: float, overall_s: float) -> None:
        now = time.monotonic()
        self.idle_s = idle_s
        self.overall_at = now + overall_s
        self.first_token_at = min(now + first_token_s, self.overall_at)
        self.phase = "first_token"
        self.expired: str | None = None  # the phase whose deadline passed
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._closed = False

    def attach(self, response: httpx.Response) -> None:
        """Find the socket the watchdog may shut down (absent on test transports)."""
        stream = response.extensions.get("network_stream")
        get = getattr(stream, "get_extra_info", None)
        sock = get("socket") if callable(get) else None
        with self._lock:
            self._socket = sock if isinstance(sock, socket.socket) else None

    def got_token(self) -> None:
        self.phase = "idle"

    def next_deadline(self) -> float:
        """The deadline of the wait about to start (monotonic seconds), after checking
        that none has passed: the first-token deadline, else now + the idle timeout,
        never past the overall deadline. The async path waits with it directly."""
        self.check()
        if self.phase == "first_token":
            return self.first_token_at
        return min(time.monotonic() + self.idle_s, self.overall_at)

    def waiting(self) -> None:
        """About to wait for upstream bytes: arm the deadline of the current phase."""
        _WATCHDOG.set(self, self.next_deadline())

    def paused(self) -> None:
        """Suspended in the consumer: upstream silence is not counted."""
        _WATCHDOG.set(self, None)

    def check(self) -> None:
        now = time.monotonic()
        if now >= self.overall_at:
            self.expired = "overall"
        elif self.phase == "first_token" and now >= self.first_token_at:
            self.expired = "first_token"
        if self.expired:
            raise self.error()

    def expire(self) -> None:
        """Called by the watchdog thread: wake the blocked read."""
        with self._lock:
            if self._closed:
                return
            self.expired = "overall" if time.monotonic() >= self.overall_at else self.phase
            sock = self._socket
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def timed_out(self, deadline: float) -> ProviderTimeoutError:
        """The wait armed with ``deadline`` (from :meth:`next_deadline`) ran out: the
        error of the phase it belonged to (the async path's counterpart of
        :meth:`expire`; a timer firing a hair early still names the right phase)."""
        self.expired = "overall" if deadline >= self.overall_at else self.phase
        return self.error()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._socket = None
        _WATCHDOG.set(self, None)

    def error(self) -> ProviderTimeoutError:
        message = {
            "first_token": "The provider sent no first token in time.",
            "idle": "The provider's stream stalled (no event within the idle timeout).",
        }.get(self.expired or "", "The provider did not finish its answer in time.")
        return ProviderTimeoutError(message)


class _Watchdog:
    """One daemon thread holding every open stream's next deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, StreamClock]] = {}
        self._thread: threading.Thread | None = None

    def set(self, clock: StreamClock, deadline: float | None) -> None:
        with self._cond:
            if deadline is None:
                self._due.pop(id(clock), None)
                return
            earliest = min((d for d, _ in self._due.values()), default=None)
            self._due[id(clock)] = (deadline, clock)
            if self._thread is None or not self._thread.is_alive():  # first use, or forked
                self._thread = threading.Thread(
                    target=self._run, name="llm-routing-stream-watchdog", daemon=True
                )
                self._thread.start()
            if earliest is None or deadline < earliest:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                fire = [c for d, c in self._due.values() if d <= now]
                for clock in fire:
                    self._due.pop(id(clock), None)
                if not fire:
                    earliest = min((d for d, _ in self._due.values()), default=None)
                    self._cond.wait(None if earliest is None else max(0.0, earliest - now))
                    continue
            for clock in fire:
                try:
                    clock.expire()
                except Exception:  # never let one stream kill the watchdog
                    logger.exception("Stream watchdog failed to expire a stream")

    def reset_after_fork(self) -> None:
        """In a forked child the parent's thread is gone and its lock may be held."""
        self._cond = threading.Condition()
        self._due = {}
        self._thread = None


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG.reset_after_fork)
