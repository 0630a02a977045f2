"""Streaming over the walk of :mod:`llm_routing.routing.walk`: :func:`route_stream` /
:func:`aroute_stream`, the commit point, the pump that hands a live stream's events to
the caller through the stream's one key filter (:func:`_pump`), the breaker's
settlement of an opened stream (:func:`_settle`), continuation (:func:`_continue`) and
the stream's exit (:func:`_finish_stream`, then the session's one exit).

A chain's ``stream_mode``: ``direct`` fails over only before the first chunk, after it
an error event; ``atomic`` buffers the whole answer, then streams it (any failure can
still fail over); ``continuation``: after a mid-stream failure, a later candidate
declaring prefill support continues the delivered text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from .. import effects
from ..effects import (
    AsyncSleeper,
    ClientGone,
    CloseStream,
    Emit,
    NextEvent,
    OpenStream,
    Sleeper,
    Steps,
    StreamHandle,
)
from ..errors import NetworkError, ProviderError, ResponseError
from ..providers.base import BaseProvider, validate_structured
from ..resilience.breaker import Observe
from ..resilience.retry import deadline_caused, error_result
from ..sanitize import StreamGuard, redacted, scrub_error
from ..types import (
    AttemptRecord,
    AuditRequest,
    ProviderConfig,
    ProviderResult,
    RouterStreamEvent,
    RoutingResult,
    StreamChunk,
    StreamDelta,
    StreamEnd,
    StreamEvent,
    StreamFailure,
    StreamResult,
    StreamToolCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
    assemble_tool_calls,
)
from .plan import Setup, _adapter_for, with_output_ceiling
from .walk import AttemptFn, _attempt_record, _gone_error, _Hold, _Session

#: The logger operators configure for the router (docs/providers.md).
logger = logging.getLogger("llm_routing.router")


def route_stream(
    request: AuditRequest,
    *,
    request_id: str | None = None,
    sleeper: Sleeper | None = None,
    persist: bool = True,
    stream_mode: str | None = None,
) -> Iterator[RouterStreamEvent]:
    """Route one request as a stream of StreamChunk events ending in exactly one
    StreamResult (complete answer, or a pre-commit error result) or StreamFailure
    (a failure after text was delivered: ``partial`` is true, nothing is replayed).

    The commit point is the first chunk handed to the caller: before it, every failure
    may fail over; after it, only the ``continuation`` mode may, and only to a
    provider that declares prefill support. Nothing runs before the first ``next()``.
    """
    core = _route_stream(request, request_id, stream_mode, persist)
    return effects.stream(core, sleeper=sleeper)


def aroute_stream(
    request: AuditRequest,
    *,
    request_id: str | None = None,
    sleeper: AsyncSleeper | None = None,
    persist: bool = True,
    stream_mode: str | None = None,
) -> AsyncIterator[RouterStreamEvent]:
    """:func:`route_stream` for the event loop (the same walk, driven with awaits): an
    async generator. ``aclose()`` or a cancellation records the decision with the
    attempt marked ``client_disconnected``, closes the upstream stream and frees a
    probe slot."""
    core = _route_stream(request, request_id, stream_mode, persist)
    return effects.astream(core, sleeper=sleeper)


#: A live stream: the driver's opaque handle and the events read before the commit point.
_Live = tuple[StreamHandle, list[StreamEvent]]
#: Which candidate a live stream is: its provider and model (a chain may name one
#: provider with two models, and hedge one with the other).
_Key = tuple[str, str]


def _route_stream(
    request: AuditRequest, request_id: str | None, stream_mode: str | None, persist: bool
) -> Steps[None]:
    """The whole of :func:`route_stream` / :func:`aroute_stream`: its events to the
    caller are ``Emit`` effects. Whatever raises in the walk, the request ends through
    the session's one exit and the stream with its one final event."""
    started = time.perf_counter()
    session = _Session(request, (yield from Setup(request)), request_id=request_id, started=started)
    mode = stream_mode or session.plan.stream_mode
    outcome = _StreamOutcome()
    delivered: list[str] = []
    guard = StreamGuard(request)  # the one key filter of everything this stream emits
    try:
        last = yield from _stream_walk(session, mode, persist, outcome, delivered, guard)
    except ClientGone:
        if session.routed is None:
            yield from session.finish(session.gone(), None, persist=persist)
        raise
    except Exception as exc:  # a bug or a hook: still one exit and one final event
        routed = yield from session.finish(session.failed(exc), None, persist=persist)
        error = routed.result.error
        if error is None:
            last = StreamResult(routed)
        else:
            last = StreamFailure(error=error, partial=outcome.committed(delivered), routed=routed)
    yield from Emit(guard.final(last))


def _stream_walk(
    session: _Session,
    mode: str,
    persist: bool,
    outcome: _StreamOutcome,
    delivered: list[str],
    guard: StreamGuard,
) -> Steps[StreamResult | StreamFailure]:
    """The stream's walk, pump and exit; returns its final event (the caller emits it)."""
    request = session.request
    live: dict[_Key, _Live] = {}
    # Opened streams whose outcome the breaker has not seen yet (settled when they end).
    opened: dict[_Key, _Opened] = {}

    def opener(req: AuditRequest, buffer_all: bool) -> AttemptFn:
        def attempt(adapter: BaseProvider, *, hedged: _Hold | None = None) -> Steps[ProviderResult]:
            config = adapter.config
            key = (config.name, config.model)

            def invoke(api_key: str | None, timeout: float) -> Steps[ProviderResult]:
                clamped = with_output_ceiling(req, adapter.config)
                events = yield from OpenStream(adapter, clamped, api_key, timeout)
                head: list[StreamEvent] = []
                try:
                    # Failures here are pre-commit: they fail over.
                    while (event := (yield from NextEvent(events))) is not None:
                        head.append(event)
                        if isinstance(event, StreamEnd) or (
                            not buffer_all
                            and (
                                isinstance(event, StreamToolCallDelta)
                                or (isinstance(event, StreamDelta) and event.text)
                            )
                        ):
                            break
                    if not head or (buffer_all and not isinstance(head[-1], StreamEnd)):
                        # A truncated transfer, still pre-commit: transient, so it fails over.
                        raise NetworkError("The stream ended before it finished.")

                    def publish() -> None:
                        live[key] = (events, head)
                        opened[key] = (config, timeout)

                    if hedged is None:
                        publish()
                    elif not hedged.keep(publish, lambda: _drop(adapter, events, live, opened)):
                        raise ClientGone()  # its race was lost while it opened (sync)
                except (Exception, ClientGone):
                    yield from CloseStream(events)
                    raise
                return ProviderResult(
                    provider=config.name,
                    model=config.model,
                    mode=adapter.result_mode,  # type: ignore[arg-type]
                    status="ok",
                )

            return (
                yield from session.call(adapter, req, invoke, defer_success=True, hedged=hedged)
            )

        return attempt

    try:
        final, fallback_reason = yield from session.run(opener(request, mode == "atomic"))
    except ClientGone:  # cancelled before the commit point (async drivers)
        outcome.failure = _gone_error()
        final = session.gone()
        for events, _ in live.values():
            yield from CloseStream(events)
        for entry in opened.values():
            yield from _settle(session, entry, final, outcome)
        yield from session.finish(final, None, persist=persist)
        raise
    key = (final.provider, final.model)
    if not final.ok or key not in live:
        routed = yield from session.finish(final, fallback_reason, persist=persist)
        return StreamResult(routed)

    try:
        # The attempt served (a hedge's loser may be recorded after it).
        attempts = session.walk.attempts
        outcome.at = next(i for i, a in enumerate(attempts) if a.served)
        yield from _pump(live.pop(key), delivered, outcome, attempts[outcome.at], guard)
        yield from _settle(session, opened.pop(key, None), final, outcome)
        if (
            outcome.failure is not None
            and mode == "continuation"
            and delivered
            and not outcome.tool_deltas  # a prefill cannot continue a half tool call
        ):
            yield from _continue(session, opener, live, opened, delivered, outcome, guard)
    except ClientGone:
        outcome.failure = _gone_error()
        raise
    finally:
        for events, _ in live.values():
            yield from CloseStream(events)
        for entry in opened.values():  # cut short by the client: frees a probe slot
            yield from _settle(session, entry, final, outcome)
        routed = yield from _finish_stream(
            session, final, fallback_reason, delivered, outcome, persist
        )
    if outcome.failure is None:
        return StreamResult(routed)
    info = scrub_error((outcome.original or outcome.failure).to_info(), request)
    return StreamFailure(error=info, partial=outcome.committed(delivered), routed=routed)


@dataclass
class _StreamOutcome:
    end: StreamEnd | None = None
    failure: ProviderError | None = None
    original: ProviderError | None = None  # the first mid-stream failure (continuation)
    served_by: str | None = None
    at: int = -1  # the attempt the stream's end is recorded on (walk.attempts)
    # Tool-call fragments delivered (a commit point like text), in order.
    tool_deltas: list[ToolCallDelta] = field(default_factory=list)

    def committed(self, delivered: list[str]) -> bool:
        """Whether anything (text or a tool-call fragment) reached the caller."""
        return bool(delivered) or bool(self.tool_deltas)

    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The stream's tool calls: the adapter's assembled list from its StreamEnd,
        else assembled here from the fragments that were delivered."""
        if self.end is not None and self.end.tool_calls:
            return self.end.tool_calls
        return assemble_tool_calls(self.tool_deltas)


def _deliver(chunk: StreamChunk, delivered: list[str], outcome: _StreamOutcome) -> Emit:
    """A chunk that has passed the stream's key filter, as it leaves (and as it counts
    toward the answer: the text delivered, the tool-call fragments delivered)."""
    if chunk.tool_call is not None:
        outcome.tool_deltas.append(chunk.tool_call)
    if chunk.text:
        delivered.append(chunk.text)
    return Emit(chunk)


def _pump(
    source: _Live,
    delivered: list[str],
    outcome: _StreamOutcome,
    served: AttemptRecord,
    guard: StreamGuard,
) -> Steps[None]:
    """Hand a live stream's events to the caller (``Emit``, each through the stream's
    one key filter ``guard``) until its end, then close it."""
    events, head = source
    outcome.end, outcome.failure = None, None
    queued = iter(head)
    try:
        while True:
            event = next(queued, None)
            if event is None and (event := (yield from NextEvent(events))) is None:
                break
            if isinstance(event, StreamEnd):
                outcome.end = event
                break
            if isinstance(event, StreamToolCallDelta):
                chunk = StreamChunk(
                    "", provider=served.provider, model=served.model, tool_call=event.delta
                )
            elif isinstance(event, StreamDelta):
                chunk = StreamChunk(event.text, provider=served.provider, model=served.model)
            else:
                continue
            if (clean := guard.chunk(chunk)) is not None:
                yield from _deliver(clean, delivered, outcome)
        if outcome.end is None:
            outcome.failure = ResponseError("The stream was cut before it finished.")
    except ProviderError as exc:
        outcome.failure = redacted(exc)
    except Exception as exc:
        logger.exception("Stream adapter raised %s", type(exc).__name__)
        outcome.failure = ResponseError(f"The stream failed ({type(exc).__name__}).")
    except ClientGone:
        yield from CloseStream(events)
        raise
    yield from CloseStream(events)
    for rest in guard.flush(served.provider, served.model):
        yield from _deliver(rest, delivered, outcome)


#: An opened stream: the config it was called with and the timeout it was given.
_Opened = tuple[ProviderConfig, float]


def _drop(
    adapter: BaseProvider,
    events: StreamHandle,
    live: dict[_Key, _Live],
    opened: dict[_Key, _Opened],
) -> Steps[Usage | None]:
    """A hedge's loser that had opened its stream (:class:`_Hold`): forgotten, closed,
    and its circuit told it was cancelled (never a failure; it frees a probe slot). The
    usage its upstream reported, when it had sent its whole answer (``atomic``): the
    request is charged for it."""
    config = adapter.config
    key = (config.name, config.model)
    head = live.pop(key)[1]
    del opened[key]
    yield from CloseStream(events)
    gone = error_result(adapter, _gone_error(), latency_ms=0.0, retries=0, upstream_requests=1)
    yield from Observe(config, gone)
    end = head[-1] if head else None
    return end.usage if isinstance(end, StreamEnd) else None


def _settle(
    session: _Session, entry: _Opened | None, opened: ProviderResult, outcome: _StreamOutcome
) -> Steps[None]:
    """Feed an opened stream's real outcome to the breaker, under the model it was
    called with (a chain entry's override included): its success only once it ended
    cleanly, its failure after the commit point as a failure — unless it is a timeout
    only the request deadline caused (then ``budget_exhausted``, as before the commit
    point, and not charged)."""
    if entry is None:
        return
    config, timeout = entry
    failure = outcome.failure
    if failure is None:
        yield from Observe(config, opened)
        return
    failure = outcome.failure = deadline_caused(
        failure, timeout=timeout, own_timeout=config.timeout_s, budget=session.budget
    )
    error = failure.to_info()
    yield from Observe(config, replace(opened, mode="error", status="error", error=error))


def _continue(
    session: _Session,
    opener: Callable[[AuditRequest, bool], AttemptFn],
    live: dict[_Key, _Live],
    opened: dict[_Key, _Opened],
    delivered: list[str],
    outcome: _StreamOutcome,
    guard: StreamGuard,
) -> Steps[None]:
    """Mid-stream failure in continuation mode: one later candidate with prefill
    support continues the delivered text. A fallback that fails (or rejects the
    prefill) never masks the original failure."""
    original = outcome.failure
    assert original is not None
    served = session.walk.attempts[outcome.at]
    session.walk.attempts[outcome.at] = replace(
        served,
        outcome="error",
        served=False,
        partial=True,
        reason=original.category,
        error_category=original.category,
        http_status=original.http_status,
        transient=original.transient,
    )
    names = session.plan.names
    after = names[names.index(served.provider) + 1 :] if served.provider in names else ()
    request = replace(session.request, prefill="".join(delivered))
    for name in after:
        row = session.rows.get(name)
        adapter = _adapter_for(name, "", row)
        prefill = frozenset({"prefill"})
        if (yield from session.skip(name, row, adapter, None, needs=prefill)) is not None:
            continue
        assert adapter is not None  # may_try says unknown_provider without one
        result = yield from opener(request, False)(adapter)
        session.walk.add(
            **_attempt_record(result, served=result.ok), step=session.plan.step_of(name)
        )
        outcome.at = len(session.walk.attempts) - 1
        key = (result.provider, result.model)
        if not result.ok or key not in live:
            break
        yield from _pump(live.pop(key), delivered, outcome, session.walk.attempts[-1], guard)
        yield from _settle(session, opened.pop(key, None), result, outcome)
        if outcome.failure is None:
            outcome.served_by = name
            return
        break
    outcome.original = original
    outcome.failure = outcome.failure or original


def _stream_data(request: AuditRequest, text: str) -> Any:
    """The parsed structured answer of a complete stream, as ``route`` returns it."""
    if request.response_schema is None:
        return None
    try:
        return validate_structured(text, request.response_schema)
    except ResponseError:
        return None


def _finish_stream(
    session: _Session,
    final: ProviderResult,
    fallback_reason: str | None,
    delivered: list[str],
    outcome: _StreamOutcome,
    persist: bool,
) -> Steps[RoutingResult]:
    attempts, at = session.walk.attempts, outcome.at
    last = attempts[at]
    failure = outcome.failure
    end = outcome.end
    if failure is not None and end is not None and end.usage is not None:
        # The upstream finished and reported its usage, then the request was cut (the
        # client, a cancellation): that usage is charged all the same.
        last = attempts[at] = replace(last, usage=end.usage)
    if failure is not None and not last.partial:
        attempts[at] = replace(
            last,
            outcome="error",
            served=False,
            partial=outcome.committed(delivered),
            reason=failure.category,
            error_category=failure.category,
            http_status=failure.http_status,
            transient=failure.transient,
        )
    provider = outcome.served_by or final.provider
    if failure is None:
        result = replace(
            final,
            provider=provider,
            model=(end.model if end and end.model else attempts[at].model),
            output="".join(delivered),
            data=_stream_data(session.request, "".join(delivered)),
            usage=(end.usage if end and end.usage else final.usage),
            finish_reason=end.finish_reason if end else None,
            tool_calls=outcome.tool_calls(),
        )
        if outcome.served_by:
            fallback_reason = fallback_reason or "continuation"
    else:
        error = (outcome.original or failure).to_info()
        result = replace(
            final, mode="error", status="error", output="".join(delivered), error=error
        )
    return (yield from session.finish(result, fallback_reason, persist=persist))
