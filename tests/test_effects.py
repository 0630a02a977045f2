"""The effect vocabulary and its two trampolines (llm_routing/effects.py), on both
drivers: typed results, exceptions raised into the core, quiet effects, the cleanup a
closed, dropped, cancelled or torn-down driver runs, and the core effects themselves
against a duck-typed adapter."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from llm_routing import effects
from llm_routing.effects import (
    ClientGone,
    CloseStream,
    Complete,
    Context,
    Effect,
    Emit,
    NextEvent,
    OpenStream,
    Sleep,
    Steps,
    StreamHandle,
)
from llm_routing.types import AuditRequest

marker: contextvars.ContextVar[str] = contextvars.ContextVar("test_effects_marker", default="-")


class Stop(BaseException):
    """Tears a driver down (as a KeyboardInterrupt would)."""


@dataclass(frozen=True)
class Twice(Effect[int]):
    """→ twice ``n``; ``seen`` gets what the driver lent it."""

    n: int
    seen: list[Any] = field(default_factory=list)

    def run(self, ctx: Context) -> int:
        self.seen.append(("run", ctx.sleeper, ctx.asleeper, ctx.finalizing, marker.get()))
        return 2 * self.n

    async def arun(self, ctx: Context) -> int:
        self.seen.append(("arun", ctx.sleeper, ctx.asleeper, ctx.finalizing, marker.get()))
        return 2 * self.n


@dataclass(frozen=True)
class Fails(Effect[str]):
    """Raises ``error``; quiet or not."""

    error: BaseException
    loud: bool = True

    @property
    def quiet(self) -> bool:  # type: ignore[override]
        return not self.loud

    def fallback(self) -> str:
        return "fallback"

    def run(self, ctx: Context) -> str:
        raise self.error

    async def arun(self, ctx: Context) -> str:
        raise self.error


@dataclass(frozen=True)
class Hangs(Effect[None]):
    """Waits until cancelled (async only); ``started`` is set once it waits."""

    started: asyncio.Event

    def run(self, ctx: Context) -> None:
        raise AssertionError("async only")

    async def arun(self, ctx: Context) -> None:
        self.started.set()
        await asyncio.Event().wait()


def _arun(core: Steps[Any]) -> Any:
    return asyncio.run(effects.arun(core))


DRIVERS: list[Callable[[Steps[Any]], Any]] = [effects.run, _arun]
IDS = ["sync", "async"]


@pytest.mark.parametrize("drive", DRIVERS, ids=IDS)
def test_a_core_gets_each_effects_result_and_the_driver_its_return_value(
    drive: Callable[[Steps[Any]], Any],
) -> None:
    seen: list[Any] = []

    def core() -> Steps[tuple[int, int]]:
        first = yield from Twice(2, seen)
        second = yield Twice(first, seen)
        return first, second

    assert drive(core()) == (4, 8)
    assert [s[1:] for s in seen] == [(None, None, False, "-")] * 2


def test_each_driver_lends_its_sleeper_to_sleep() -> None:
    slept: list[float] = []

    def core() -> Steps[None]:
        yield from Sleep(1.5)

    effects.run(core(), sleeper=slept.append)

    async def asleep(seconds: float) -> None:
        slept.append(-seconds)

    asyncio.run(effects.arun(core(), sleeper=asleep))
    assert slept == [1.5, -1.5]


def _sleep_zero() -> Steps[str]:
    yield from Sleep(0)
    return "slept"


def test_the_default_sleepers_are_time_and_asyncio_sleep() -> None:
    assert effects.run(_sleep_zero()) == "slept"
    assert asyncio.run(effects.arun(_sleep_zero())) == "slept"


@pytest.mark.parametrize("drive", DRIVERS, ids=IDS)
def test_an_effects_exception_is_raised_into_the_core_at_its_yield(
    drive: Callable[[Steps[Any]], Any],
) -> None:
    def core() -> Steps[str]:
        try:
            yield from Fails(ValueError("no"))
        except ValueError as exc:
            after = yield from Twice(1)
            return f"caught {exc} then {after}"
        return "not raised"

    assert drive(core()) == "caught no then 2"


@pytest.mark.parametrize("drive", DRIVERS, ids=IDS)
def test_a_quiet_effect_that_fails_hands_the_core_its_fallback_and_is_logged(
    drive: Callable[[Steps[Any]], Any], caplog: pytest.LogCaptureFixture
) -> None:
    def core() -> Steps[str]:
        return (yield from Fails(ValueError("s3cret detail"), loud=False))

    with caplog.at_level(logging.ERROR, logger="llm_routing.effects"):
        assert drive(core()) == "fallback"
    assert [r.getMessage() for r in caplog.records] == [
        "Fails failed (ValueError); routing goes on without it."
    ]
    assert "s3cret" not in caplog.text


def test_an_effect_that_is_not_quiet_has_no_fallback_and_the_base_runs_nothing() -> None:
    with pytest.raises(TypeError, match=r"^Twice is not quiet: it has no fallback\.$"):
        Twice(1).fallback()
    base: Effect[None] = Effect()
    with pytest.raises(NotImplementedError):
        base.run(Context())
    with pytest.raises(NotImplementedError):
        asyncio.run(base.arun(Context()))
    assert not Effect.quiet and CloseStream.quiet


def _cleans_up(seen: list[Any]) -> Callable[[Effect[Any]], Steps[str]]:
    """A core that asks for ``effect`` and, when the driver goes away, cleans up with
    one effect (and an Emit, which cleanup ignores)."""

    def core(effect: Effect[Any]) -> Steps[str]:
        try:
            yield from effect
        except ClientGone:
            seen.append("gone")
            got = yield from Emit("ignored")
            seen.append(("emit answered", got))
            yield from Twice(5, seen)
            raise
        return "done"

    return core


@pytest.mark.parametrize("drive", DRIVERS, ids=IDS)
def test_a_torn_down_driver_abandons_the_core_without_running_its_cleanup(
    drive: Callable[[Steps[Any]], Any],
) -> None:
    seen: list[Any] = []
    with pytest.raises(Stop):
        drive(_cleans_up(seen)(Fails(Stop())))
    assert seen == ["gone"]  # ClientGone again at the Emit: no cleanup effect executed


@pytest.mark.parametrize("drive", DRIVERS, ids=IDS)
def test_emit_outside_a_stream_is_a_type_error_after_the_cores_cleanup(
    drive: Callable[[Steps[Any]], Any],
) -> None:
    seen: list[Any] = []
    with pytest.raises(
        TypeError,
        match=r"^Emit is a stream driver's yield; run\(\)/arun\(\) drive cores that emit "
        r"nothing\.$",
    ):
        drive(_cleans_up(seen)(Emit("event")))
    assert seen[:2] == ["gone", ("emit answered", None)]
    assert [s[0] for s in seen[2:]] == [("run" if drive is effects.run else "arun")]


def test_emit_itself_is_never_executed() -> None:
    with pytest.raises(
        TypeError, match=r"^Emit is a stream driver's yield, not an executable effect\.$"
    ):
        Emit(1).run(Context())
    with pytest.raises(
        TypeError, match=r"^Emit is a stream driver's yield, not an executable effect\.$"
    ):
        asyncio.run(Emit(1).arun(Context()))


def test_abandoning_stops_a_core_that_keeps_cleaning_up_and_logs_one_that_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[int] = []

    def stubborn() -> Steps[None]:
        yield from Fails(Stop())

    def keeps_going() -> Steps[None]:
        try:
            yield from Fails(Stop())
        finally:
            for n in range(3):
                try:
                    yield from Twice(n)
                except ClientGone:
                    ran.append(n)

    def breaks() -> Steps[None]:
        try:
            yield from Fails(Stop())
        except ClientGone:
            raise ValueError("cleanup bug") from None

    for core in (stubborn, keeps_going, breaks):
        with pytest.raises(Stop):
            effects.run(core())
    assert ran == [0, 1, 2]  # ClientGone at every cleanup yield, no effect executed
    assert [r.getMessage() for r in caplog.records] == [
        "The routing core failed while being abandoned."
    ]


def _stream_core(seen: list[Any]) -> Steps[None]:
    try:
        for n in (1, 2, 3):
            got = yield from Emit(n)
            seen.append(("sent", got))
    except ClientGone:
        yield from Emit("ignored")
        yield from Sleep(0)  # with the stream's own sleeper, in a finalizer too
        yield from Twice(7, seen)
        raise
    yield from Twice(9, seen)


def test_a_sync_stream_yields_the_emitted_events_and_runs_the_rest_to_its_end() -> None:
    seen: list[Any] = []
    events = effects.stream(_stream_core(seen), sleeper=print)
    assert iter(events) is events
    assert list(events) == [1, 2, 3]
    assert seen[:3] == [("sent", None)] * 3
    assert seen[3][:4] == ("run", print, None, False)


def test_closing_a_sync_stream_runs_the_cores_cleanup_now() -> None:
    seen: list[Any] = []
    events = effects.stream(_stream_core(seen))
    assert next(events) == 1
    token = marker.set("closing")
    try:
        events.close()
    finally:
        marker.reset(token)
    assert seen == [("run", None, None, False, "closing")]
    with pytest.raises(StopIteration):
        next(events)


def test_a_dropped_sync_stream_cleans_up_in_its_own_thread_in_the_context_made_in() -> None:
    # The finalizer interrupts whatever the collecting thread was doing (perhaps inside
    # a lock the cleanup's cache call would take again): the cleanup runs elsewhere.
    seen: list[Any] = []
    slept: list[tuple[float, str]] = []

    def sleeper(seconds: float) -> None:
        slept.append((seconds, threading.current_thread().name))

    token = marker.set("made")
    events = effects.stream(_stream_core(seen), sleeper=sleeper)
    marker.reset(token)
    assert next(events) == 1
    del events
    gc.collect()
    assert effects.join_finalizers(timeout=10)
    assert seen == [("run", sleeper, None, True, "made")]
    assert slept == [(0, "llm-routing-stream-cleanup")]


@dataclass(frozen=True)
class Waits(Effect[None]):
    """Blocks until ``until`` is set (a cleanup that takes a while)."""

    until: threading.Event

    def run(self, ctx: Context) -> None:
        self.until.wait(10)

    async def arun(self, ctx: Context) -> None:
        raise AssertionError("sync only")


def _dropped(core: Steps[None], sleeper: Any = None) -> None:
    events = effects.stream(core, sleeper=sleeper)
    assert next(events) == 1
    del events
    gc.collect()


def test_join_finalizers_waits_until_every_dropped_streams_cleanup_has_finished() -> None:
    release = threading.Event()

    def slow_cleanup() -> Steps[None]:
        try:
            yield from Emit(1)
        except ClientGone:
            yield from Waits(release)
            raise

    _dropped(slow_cleanup())
    _dropped(slow_cleanup())
    assert effects.join_finalizers(timeout=0.05) is False  # both still running
    release.set()
    assert effects.join_finalizers(timeout=10) is True
    assert effects.join_finalizers() is True  # none left: at once, without a timeout


def test_when_no_thread_can_start_a_dropped_stream_cleans_up_where_it_was_collected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    seen: list[Any] = []
    slept: list[str] = []
    monkeypatch.setattr(threading.Thread, "start", refuse)
    _dropped(_stream_core(seen), sleeper=lambda s: slept.append(threading.current_thread().name))
    monkeypatch.undo()
    assert slept == [threading.current_thread().name]
    assert [s[0] for s in seen] == ["run"]
    assert effects.join_finalizers(timeout=1) is True  # counted as finished


def test_an_async_stream_yields_the_emitted_events_and_cleans_up_on_aclose() -> None:
    async def main() -> list[Any]:
        seen: list[Any] = []
        events = effects.astream(_stream_core(seen))
        assert [e async for e in events] == [1, 2, 3]
        events = effects.astream(_stream_core(seen))
        assert await anext(events) == 1
        await events.aclose()
        return seen

    seen = asyncio.run(main())
    assert [s[0] for s in seen] == ["sent"] * 3 + ["arun", "arun"]
    assert seen[3][1:] == seen[4][1:] == (None, None, False, "-")


def test_an_async_stream_cancelled_at_an_event_cleans_up_and_stays_cancelled() -> None:
    async def main() -> list[Any]:
        seen: list[Any] = []
        events = effects.astream(_stream_core(seen))
        assert await anext(events) == 1
        with pytest.raises(asyncio.CancelledError):
            await events.athrow(asyncio.CancelledError())
        return seen

    assert [s[0] for s in asyncio.run(main())] == ["arun"]


@pytest.mark.parametrize("stream", [False, True], ids=["arun", "astream"])
def test_a_cancellation_during_an_effect_runs_the_cores_cleanup_then_propagates(
    stream: bool,
) -> None:
    async def main() -> list[Any]:
        seen: list[Any] = []
        started = asyncio.Event()
        core = _cleans_up(seen)(Hangs(started))
        if stream:
            events = effects.astream(core)
            task = asyncio.ensure_future(anext(events))
        else:
            task = asyncio.ensure_future(effects.arun(core))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen

    seen = asyncio.run(main())
    assert seen[:2] == ["gone", ("emit answered", None)]
    assert seen[2][0] == "arun"


def test_cancelled_again_while_cleaning_up_the_core_is_abandoned() -> None:
    async def main() -> list[Any]:
        seen: list[Any] = []
        first, second = asyncio.Event(), asyncio.Event()

        def core() -> Steps[None]:
            try:
                yield from Hangs(first)
            except ClientGone:
                try:
                    yield from Hangs(second)
                except ClientGone:
                    seen.append("abandoned")
                    yield from Twice(1, seen)  # never executed
                    raise

        task = asyncio.ensure_future(effects.arun(core()))
        await first.wait()
        task.cancel()
        await second.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen

    assert asyncio.run(main()) == ["abandoned"]


# --- the core effects against a duck-typed adapter ------------------------------------------


class Closable(Iterator[int]):
    def __init__(self, items: list[int], fail: bool = False) -> None:
        self.items, self.fail, self.closed = iter(items), fail, False

    def __next__(self) -> int:
        return next(self.items)

    def close(self) -> None:
        self.closed = True
        if self.fail:
            raise ValueError("close failed")


class AClosable(AsyncIterator[int]):
    def __init__(self, items: list[int], fail: bool = False) -> None:
        self.items, self.fail, self.closed = iter(items), fail, False

    async def __anext__(self) -> int:
        try:
            return next(self.items)
        except StopIteration:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self.closed = True
        if self.fail:
            raise ValueError("close failed")


class Adapter:
    """What the effects call on an adapter, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def complete(self, request: Any, *, api_key: Any, timeout: Any) -> str:
        self.calls.append(("complete", request, api_key, timeout))
        return "answer"

    async def acomplete(self, request: Any, *, api_key: Any, timeout: Any) -> str:
        self.calls.append(("acomplete", request, api_key, timeout))
        return "aanswer"

    def embed(self, request: Any, *, api_key: Any, timeout: Any) -> str:
        self.calls.append(("embed", request, api_key, timeout))
        return "vectors"

    async def aembed(self, request: Any, *, api_key: Any, timeout: Any) -> str:
        self.calls.append(("aembed", request, api_key, timeout))
        return "avectors"

    def stream(self, request: Any, *, api_key: Any, timeout: Any) -> list[int]:
        self.calls.append(("stream", request, api_key, timeout))
        return [1, 2]  # an iterable: the effect makes the iterator

    def astream(self, request: Any, *, api_key: Any, timeout: Any) -> AClosable:
        self.calls.append(("astream", request, api_key, timeout))
        return AClosable([1, 2])


def test_complete_calls_the_adapter_with_the_key_and_timeout_on_both_drivers() -> None:
    adapter = Adapter()
    chat = AuditRequest(task="t", input_text="x")
    effect = Complete(adapter, chat, "k", 2.5)  # type: ignore[arg-type]
    assert effect.run(Context()) == "answer"
    assert asyncio.run(effect.arun(Context())) == "aanswer"
    embed = AuditRequest(task="t", input_text="x", call="embed")
    effect = Complete(adapter, embed, None, 1.0)  # type: ignore[arg-type]
    assert effect.run(Context()) == "vectors"
    assert asyncio.run(effect.arun(Context())) == "avectors"
    assert adapter.calls == [
        ("complete", chat, "k", 2.5),
        ("acomplete", chat, "k", 2.5),
        ("embed", embed, None, 1.0),
        ("aembed", embed, None, 1.0),
    ]


def test_a_stream_is_opened_read_to_its_end_and_closed_on_both_drivers() -> None:
    adapter = Adapter()
    opened = OpenStream(adapter, "req", None, 1.0)  # type: ignore[arg-type]
    handle = opened.run(Context())
    assert handle.aevents is None
    assert [NextEvent(handle).run(Context()) for _ in range(3)] == [1, 2, None]
    CloseStream(handle).run(Context())  # a plain iterator: nothing to close

    async def main() -> list[Any]:
        ahandle = await opened.arun(Context())
        assert ahandle.events is None
        read = [await NextEvent(ahandle).arun(Context()) for _ in range(3)]
        await CloseStream(ahandle).arun(Context())
        assert isinstance(ahandle.aevents, AClosable) and ahandle.aevents.closed
        return read

    assert asyncio.run(main()) == [1, 2, None]
    assert [c[0] for c in adapter.calls] == ["stream", "astream"]
    assert StreamHandle() == StreamHandle(None, None)


def test_a_stream_handle_is_read_only_by_its_own_trampoline() -> None:
    with pytest.raises(TypeError, match=r"^An async stream read by the sync trampoline\.$"):
        NextEvent(StreamHandle(aevents=AClosable([]))).run(Context())
    with pytest.raises(TypeError, match=r"^A sync stream read by the async trampoline\.$"):
        asyncio.run(NextEvent(StreamHandle(events=iter([]))).arun(Context()))


def test_closing_a_stream_never_raises_and_logs_the_error_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events, aevents = Closable([1], fail=True), AClosable([1], fail=True)
    CloseStream(StreamHandle(events=events)).run(Context())
    asyncio.run(CloseStream(StreamHandle(aevents=aevents)).arun(Context()))
    assert events.closed and aevents.closed
    assert [r.getMessage() for r in caplog.records] == [
        "Closing an upstream stream failed (ValueError)."
    ] * 2
    assert CloseStream(StreamHandle()).fallback() is None
    CloseStream(StreamHandle()).run(Context())  # nothing open: nothing to close
    asyncio.run(CloseStream(StreamHandle()).arun(Context()))
    assert len(caplog.records) == 2


class _Counted(Effect[int]):
    """An effect whose run counts how often a driver executed it."""

    runs: ClassVar[int] = 0

    def run(self, ctx: Context) -> int:
        _Counted.runs += 1
        return _Counted.runs

    async def arun(self, ctx: Context) -> int:
        return self.run(ctx)


@pytest.mark.parametrize("drive", DRIVERS, ids=IDS)
def test_each_effect_runs_once(drive: Callable[[Steps[Any]], Any]) -> None:
    _Counted.runs = 0

    def core() -> Steps[list[int]]:
        out = []
        for _ in range(3):
            out.append((yield from _Counted()))
        return out

    assert drive(core()) == [1, 2, 3]


# --- Race: a hedged attempt on either trampoline ----------------------------------------


def _side(name: str, seconds: float, log: list[str], *, ok: bool = True) -> Steps[Any]:
    from llm_routing.types import ErrorInfo, ProviderResult

    log.append(f"{name} started")
    try:
        yield from effects.Sleep(seconds)
    except effects.ClientGone:
        log.append(f"{name} cancelled")
        raise
    log.append(f"{name} ended")
    error = None if ok else ErrorInfo(category="server_error", message="no")
    return ProviderResult(provider=name, model="", mode="live", status="ok" if ok else "error",
                          error=error)  # fmt: skip


def _race(first: Steps[Any], second: Steps[Any], after_s: float) -> Steps[Any]:
    return (yield from effects.Race(first, second, after_s))


def _drive_race(trampoline: str, core: Steps[Any]) -> Any:
    if trampoline == "sync":
        return effects.run(core)
    return asyncio.run(effects.arun(core))


@pytest.mark.parametrize("trampoline", ["sync", "async"])
def test_race_the_second_wins_and_the_first_is_cancelled(trampoline: str) -> None:
    log: list[str] = []
    raced = _drive_race(trampoline, _race(_side("a", 3.0, log), _side("b", 0.05, log), 0.1))
    assert (raced.winner, raced.hedged) == (1, True)
    assert raced.results[0] is None and raced.results[1].provider == "b"
    assert raced.lost_ms >= 100  # the loser ran from its start until b answered
    assert set(log[:2]) == {"a started", "b started"} and log[2] == "b ended"
    if trampoline == "async":  # the loser's task unwound at once
        assert log[3:] == ["a cancelled"]
    else:  # the loser's thread is still asleep: it unwinds when it wakes
        assert log[3:] == []


@pytest.mark.parametrize("trampoline", ["sync", "async"])
def test_race_without_a_hedge_when_the_first_ends_in_time(trampoline: str) -> None:
    log: list[str] = []
    raced = _drive_race(trampoline, _race(_side("a", 0.05, log), _side("b", 0.05, log), 3.0))
    assert (raced.winner, raced.hedged, raced.results[1]) == (0, False, None)
    assert raced.lost_ms == 0.0
    assert log == ["a started", "a ended"]  # the second core never ran


@pytest.mark.parametrize("trampoline", ["sync", "async"])
def test_race_a_failed_side_leaves_the_other_to_its_end(trampoline: str) -> None:
    log: list[str] = []
    first = _side("a", 0.3, log, ok=False)
    raced = _drive_race(trampoline, _race(first, _side("b", 1.0, log), 0.05))
    assert (raced.winner, raced.hedged) == (1, True)
    assert [r.provider for r in raced.results] == ["a", "b"]
    assert set(log[:2]) == {"a started", "b started"} and log[2:] == ["a ended", "b ended"]


class _Torn(BaseException):
    """Not an Exception: what tears a driver down."""


def _raising(exc: BaseException) -> Steps[Any]:
    yield from effects.Sleep(0.01)
    raise exc


def _emitting() -> Steps[Any]:
    yield effects.Emit("chunk")
    return None


@pytest.mark.parametrize("trampoline", ["sync", "async"])
def test_race_a_side_that_raises_or_emits_is_its_outcome(trampoline: str) -> None:
    log: list[str] = []
    raced = _drive_race(trampoline, _race(_raising(ValueError("bug")), _side("b", 0.05, log), 3))
    assert isinstance(raced.results[0], ValueError) and raced.winner is None
    assert (raced.hedged, raced.results[1], log) == (False, None, [])
    raced = _drive_race(trampoline, _race(_emitting(), _side("b", 0.05, log), 3.0))
    assert isinstance(raced.results[0], TypeError) and raced.winner is None
    assert str(raced.results[0]) == (
        "Emit is a stream driver's yield; run()/arun() drive cores that emit nothing."
    )


def test_race_a_sync_side_torn_down_ends_the_race_with_an_error() -> None:
    log: list[str] = []
    raced = effects.run(_race(_raising(_Torn()), _side("b", 0.05, log), 3.0))
    assert isinstance(raced.results[0], RuntimeError) and "_Torn" in str(raced.results[0])


@pytest.mark.parametrize("trampoline", ["sync", "async"])
def test_race_the_first_wins_after_the_hedge_started(trampoline: str) -> None:
    log: list[str] = []
    raced = _drive_race(trampoline, _race(_side("a", 0.3, log), _side("b", 3.0, log), 0.05))
    assert (raced.winner, raced.hedged) == (0, True)
    assert raced.results[0].provider == "a" and raced.results[1] is None
    assert raced.lost_ms > 0


@pytest.mark.parametrize("trampoline", ["sync", "async"])
def test_race_the_losers_run_time_is_read_from_its_own_start(
    trampoline: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks = itertools.count(1)  # one second per reading: the first's start, the second's, the win
    clock = SimpleNamespace(perf_counter=lambda: float(next(ticks)), sleep=time.sleep)
    monkeypatch.setattr(effects, "time", clock)
    log: list[str] = []
    raced = _drive_race(trampoline, _race(_side("a", 3.0, log), _side("b", 0.05, log), 0.1))
    assert (raced.winner, raced.lost_ms) == (1, 2000.0)  # the first ran from 1 s to 3 s


@pytest.mark.parametrize("trampoline", ["sync", "async"])
def test_race_the_first_wins_after_the_second_failed(trampoline: str) -> None:
    log: list[str] = []
    first, second = _side("a", 0.3, log), _side("b", 0.05, log, ok=False)
    raced = _drive_race(trampoline, _race(first, second, 0.05))
    assert (raced.winner, raced.hedged, raced.lost_ms) == (0, True, 0.0)
    assert [r.provider for r in raced.results] == ["a", "b"]
    assert log[2:] == ["b ended", "a ended"]


def _cleaning(name: str, log: list[str]) -> Steps[Any]:
    """A side whose cleanup takes an effect of its own."""
    log.append(f"{name} started")
    try:
        yield from effects.Sleep(3.0)
    except effects.ClientGone:
        yield from effects.Sleep(0.05)
        log.append(f"{name} cleaned up")
        raise
    log.append(f"{name} ended")
    raise AssertionError("never cancelled")


def test_a_race_cancelled_on_the_event_loop_cancels_both_sides_and_waits_for_their_cleanup() -> (
    None
):
    log: list[str] = []

    async def main() -> list[str]:
        race = _race(_cleaning("a", log), _cleaning("b", log), 0.05)
        task = asyncio.ensure_future(effects.arun(race))
        while len(log) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return list(log)  # what had happened when the cancelled driver returned

    seen = asyncio.run(main())
    assert seen[:2] == ["a started", "b started"]
    assert sorted(seen[2:]) == ["a cleaned up", "b cleaned up"]


def test_a_sync_loser_still_in_its_call_never_holds_the_process_open() -> None:
    before = set(threading.enumerate())
    log: list[str] = []
    raced = effects.run(_race(_side("a", 10.0, log), _side("b", 0.05, log), 0.1))
    assert raced.winner == 1 and log[-1] == "b ended"  # a is still asleep in its thread
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left and all(t.daemon for t in left)  # the interpreter may exit without them


@pytest.mark.parametrize("trampoline", ["sync", "async"])
def test_race_both_sides_failing_have_no_winner(trampoline: str) -> None:
    log: list[str] = []
    first, second = _side("a", 0.3, log, ok=False), _side("b", 0.05, log, ok=False)
    raced = _drive_race(trampoline, _race(first, second, 0.05))
    assert (raced.winner, raced.hedged, raced.lost_ms) == (None, True, 0.0)
    assert [r.status for r in raced.results] == ["error", "error"]
    assert log[2:] == ["b ended", "a ended"]
