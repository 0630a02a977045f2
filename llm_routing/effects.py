"""The effect protocol of the routing core, and its two trampolines (sync and async).

The routing algorithm (the walk in :mod:`llm_routing.routing.walk`, the retry loop in
:mod:`llm_routing.resilience.retry`, the breaker's decisions in
:mod:`llm_routing.resilience.breaker`) is written once, as generators that never do
I/O: they ask for an :class:`Effect` describing what they need done and receive its
result through ``send()`` (or its exception through ``throw()``). An ``Effect[R]``
answers an ``R``: ``result = yield from Complete(...)`` is typed (a ProviderResult);
composition is ``yield from``.

Every driver runs on one of two trampolines, the only loops that send to and throw
into a core: :func:`_drive` calls :meth:`Effect.run` (blocking: ``adapter.complete``,
``time.sleep``, ``next(it)``, a cache call); :func:`_adrive` awaits
:meth:`Effect.arun` (``await adapter.acomplete``, ``asyncio.sleep``,
``await it.__anext__()``, an async cache call). Each runs the core until it returns
or emits an :class:`Emit`: :func:`run` and :func:`arun` want the return value,
:func:`stream` and :func:`astream` hand each emitted event to their caller and call
the trampoline again. Each effect knows its own sync and async execution, so effects
of other layers (the breaker's ``Allow`` / ``Observe`` / ``CacheOp``, the router's
``Setup`` / ``Record`` / ``Announce``) live beside the code they call and the
trampolines stay generic.

Client disconnect: a trampoline that sees its caller go away (``GeneratorExit`` on the
sync generator; ``aclose()`` or ``CancelledError`` on the async one, during an
effect or at an ``Emit``) throws :class:`ClientGone` into the core, executes the
effects of the core's cleanup (close the upstream, free a probe slot, record the
decision), then re-raises the original exception. ``ClientGone`` derives from
BaseException so no ``except Exception`` in the core (an adapter-bug guard) can
swallow it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from .providers.base import BaseProvider
from .types import AuditRequest, ProviderResult, StreamEvent

__all__ = [
    "AsyncSleeper",
    "ClientGone",
    "CloseStream",
    "Complete",
    "Effect",
    "Emit",
    "NextEvent",
    "OpenStream",
    "Race",
    "Raced",
    "Sleep",
    "Sleeper",
    "Steps",
    "StreamHandle",
    "SyncStream",
    "arun",
    "astream",
    "join_finalizers",
    "run",
    "stream",
]

logger = logging.getLogger("llm_routing.effects")

T = TypeVar("T")
#: What an effect answers.
R = TypeVar("R", covariant=True)
Sleeper = Callable[[float], None]
AsyncSleeper = Callable[[float], Awaitable[None]]


class ClientGone(BaseException):
    """Thrown into the core by a driver whose caller went away; the core runs its
    cleanup (by yielding effects) and lets it propagate."""


@dataclass(frozen=True, slots=True)
class Context:
    """What a driver lends to the effects it executes (the injected sleeper).

    ``finalizing``: the effects run from a garbage collector's finalizer (a sync stream
    dropped without ``close()``), inside whatever code it interrupted — an effect must
    not block on the database there (the router's ``Record`` hands its rows to the
    write-behind queue instead)."""

    sleeper: Sleeper | None = None
    asleeper: AsyncSleeper | None = None
    finalizing: bool = False


class Effect(Generic[R]):
    """One piece of I/O the core asks for, answering an ``R``. ``run`` executes it
    blocking, ``arun`` awaiting; both return the value the core receives (or raise
    into the core). ``yield from effect`` asks for it with a typed result.

    A *quiet* effect is bookkeeping whose failure must not change the request's
    outcome (the breaker's ``Allow`` / ``Observe``, closing a stream): the trampolines
    log its exception and hand the core :meth:`fallback` instead of raising into it."""

    __slots__ = ()
    quiet: ClassVar[bool] = False

    def __iter__(self) -> Generator[Effect[R], R, R]:
        return (yield self)

    def fallback(self) -> R:
        """What the core receives when a quiet effect failed."""
        raise TypeError(f"{type(self).__name__} is not quiet: it has no fallback.")

    def run(self, ctx: Context) -> R:
        raise NotImplementedError

    async def arun(self, ctx: Context) -> R:
        raise NotImplementedError


#: A core generator: yields effects, receives their results, returns a T. (The value
#: sent is each effect's own ``R``; ``yield from effect`` types it.)
Steps = Generator[Effect[object], Any, T]


@dataclass(frozen=True, slots=True)
class Sleep(Effect[None]):
    """Wait ``seconds`` (a retry's backoff) → None."""

    seconds: float

    def run(self, ctx: Context) -> None:
        (time.sleep if ctx.sleeper is None else ctx.sleeper)(self.seconds)

    async def arun(self, ctx: Context) -> None:
        await (asyncio.sleep if ctx.asleeper is None else ctx.asleeper)(self.seconds)


@dataclass(frozen=True, slots=True)
class Complete(Effect[ProviderResult]):
    """One upstream call → ProviderResult (or the adapter's ProviderError): the
    adapter's ``embed`` for an embeddings request, else its ``complete``."""

    adapter: BaseProvider
    request: AuditRequest
    api_key: str | None
    timeout: float

    def run(self, ctx: Context) -> ProviderResult:
        if self.request.call == "embed":
            return self.adapter.embed(self.request, api_key=self.api_key, timeout=self.timeout)
        return self.adapter.complete(self.request, api_key=self.api_key, timeout=self.timeout)

    async def arun(self, ctx: Context) -> ProviderResult:
        if self.request.call == "embed":
            return await self.adapter.aembed(
                self.request, api_key=self.api_key, timeout=self.timeout
            )
        return await self.adapter.acomplete(
            self.request, api_key=self.api_key, timeout=self.timeout
        )


@dataclass(frozen=True, slots=True)
class StreamHandle:
    """An open upstream stream, opaque to the core: the sync trampoline's iterator or
    the async one's; only :class:`NextEvent` and :class:`CloseStream` look into it."""

    events: Iterator[StreamEvent] | None = None
    aevents: AsyncIterator[StreamEvent] | None = None


@dataclass(frozen=True, slots=True)
class OpenStream(Effect[StreamHandle]):
    """Open a stream → its :class:`StreamHandle`."""

    adapter: BaseProvider
    request: AuditRequest
    api_key: str | None
    timeout: float

    def run(self, ctx: Context) -> StreamHandle:
        events = self.adapter.stream(self.request, api_key=self.api_key, timeout=self.timeout)
        return StreamHandle(events=iter(events))

    async def arun(self, ctx: Context) -> StreamHandle:
        events = self.adapter.astream(self.request, api_key=self.api_key, timeout=self.timeout)
        return StreamHandle(aevents=aiter(events))


@dataclass(frozen=True, slots=True)
class NextEvent(Effect[StreamEvent | None]):
    """The stream's next event → StreamEvent, or None once it is exhausted."""

    handle: StreamHandle

    def run(self, ctx: Context) -> StreamEvent | None:
        if self.handle.events is None:
            raise TypeError("An async stream read by the sync trampoline.")
        return next(self.handle.events, None)

    async def arun(self, ctx: Context) -> StreamEvent | None:
        if self.handle.aevents is None:
            raise TypeError("A sync stream read by the async trampoline.")
        try:
            return await anext(self.handle.aevents)
        except StopAsyncIteration:
            return None


@dataclass(frozen=True, slots=True)
class CloseStream(Effect[None]):
    """Close a stream (stops the upstream request) → None; never raises."""

    handle: StreamHandle
    quiet: ClassVar[bool] = True

    def fallback(self) -> None:
        return None

    def run(self, ctx: Context) -> None:
        close = getattr(self.handle.events, "close", None)
        try:
            if close is not None:
                close()
        except Exception as exc:  # a closing error must not mask the outcome
            logger.warning("Closing an upstream stream failed (%s).", type(exc).__name__)

    async def arun(self, ctx: Context) -> None:
        aclose = getattr(self.handle.aevents, "aclose", None)
        try:
            if aclose is not None:
                await aclose()
        except Exception as exc:
            logger.warning("Closing an upstream stream failed (%s).", type(exc).__name__)


@dataclass(frozen=True, slots=True)
class Emit(Effect[None]):
    """Hand one event to the stream's caller → None. Not executed: the trampoline stops
    at it and the stream driver yields it; while the core cleans up after
    :class:`ClientGone`, it is ignored."""

    event: object

    def run(self, ctx: Context) -> None:
        raise TypeError("Emit is a stream driver's yield, not an executable effect.")

    async def arun(self, ctx: Context) -> None:
        raise TypeError("Emit is a stream driver's yield, not an executable effect.")


@dataclass(frozen=True, slots=True)
class Raced:
    """What a :class:`Race` answers. ``results``: each side's ProviderResult, or the
    Exception its core raised, or None — the second never started, or the side was
    cancelled because the other answered first (the loser). ``winner``: the side whose
    successful answer came first (None: neither answered successfully, or the first
    ended before the second was due). ``hedged``: the second started. ``lost_ms``: how
    long the cancelled loser ran."""

    results: tuple[ProviderResult | Exception | None, ProviderResult | Exception | None]
    winner: int | None = None
    hedged: bool = False
    lost_ms: float = 0.0


def _ok(outcome: ProviderResult | BaseException | None) -> bool:
    return isinstance(outcome, ProviderResult) and outcome.ok


@dataclass(frozen=True, slots=True)
class Race(Effect[Raced]):
    """A hedged attempt → :class:`Raced`. Run the core ``first`` (one candidate's call,
    a generator of effects returning a ProviderResult); if it has not ended after
    ``after_s`` seconds, run ``second`` beside it. The first *successful* answer wins
    and the other side is cancelled: on the event loop its task is cancelled (its
    upstream request with it; its core unwinds through :class:`ClientGone`); on the
    sync trampoline each side runs in a worker thread, and a loser blocked in its
    upstream call cannot be interrupted — its thread ends the call in the background,
    then unwinds its core (its result is never used). A side that fails leaves the
    other running to its end."""

    first: Steps[ProviderResult]
    second: Steps[ProviderResult]
    after_s: float

    def run(self, ctx: Context) -> Raced:
        outcomes: queue.Queue[tuple[int, ProviderResult | Exception]] = queue.Queue()
        stop = (threading.Event(), threading.Event())
        started: dict[int, float] = {}

        def side(index: int, core: Steps[ProviderResult]) -> None:
            try:
                outcome: ProviderResult | Exception = _drive_until(core, ctx, stop[index])
            except ClientGone:
                return  # cancelled: nobody waits for it
            except Exception as exc:
                outcome = exc
            except BaseException as exc:  # never leave the waiting thread hanging
                outcome = RuntimeError(f"A hedged call ended with {type(exc).__name__}.")
            outcomes.put((index, outcome))

        def start(index: int, core: Steps[ProviderResult]) -> None:
            started[index] = time.perf_counter()
            runner = contextvars.copy_context().run
            threading.Thread(target=runner, args=(side, index, core), daemon=True).start()

        results: list[ProviderResult | Exception | None] = [None, None]
        start(0, self.first)
        try:
            index, outcome = outcomes.get(timeout=self.after_s)
        except queue.Empty:
            pass
        else:  # the first ended before the hedge was due (the second never runs)
            results[0] = outcome
            return Raced(results=(results[0], None), winner=0 if _ok(outcome) else None)
        start(1, self.second)
        while True:
            index, outcome = outcomes.get()
            results[index] = outcome
            other = 1 - index
            if _ok(outcome) and results[other] is None:
                stop[other].set()
                lost_ms = (time.perf_counter() - started[other]) * 1000
                return Raced(results=(results[0], results[1]), winner=index, hedged=True,
                             lost_ms=lost_ms)  # fmt: skip
            if results[other] is not None:  # both ended
                won = index if _ok(outcome) else (other if _ok(results[other]) else None)
                return Raced(results=(results[0], results[1]), winner=won, hedged=True)

    async def arun(self, ctx: Context) -> Raced:
        started: dict[int, float] = {}
        tasks: dict[asyncio.Task[ProviderResult | Emit], int] = {}
        results: list[ProviderResult | Exception | None] = [None, None]

        def start(index: int, core: Steps[ProviderResult]) -> None:
            started[index] = time.perf_counter()
            tasks[asyncio.ensure_future(_adrive(core, ctx))] = index

        def outcome_of(task: asyncio.Task[ProviderResult | Emit]) -> ProviderResult | Exception:
            exc = task.exception()
            if exc is None:
                done = task.result()
                return done if isinstance(done, ProviderResult) else TypeError(_NOT_A_STREAM)
            if isinstance(exc, Exception):
                return exc
            raise exc

        start(0, self.first)
        try:
            done, _ = await asyncio.wait(set(tasks), timeout=self.after_s)
            if done:  # the first ended before the hedge was due (the second never runs)
                outcome = outcome_of(done.pop())
                return Raced(results=(outcome, None), winner=0 if _ok(outcome) else None)
            start(1, self.second)
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    results[tasks[task]] = outcome_of(task)
                winners = [tasks[t] for t in done if _ok(results[tasks[t]])]
                if winners and pending:  # cancel the loser, wait for its cleanup
                    loser = pending.pop()
                    loser.cancel()
                    lost_ms = (time.perf_counter() - started[tasks[loser]]) * 1000
                    await asyncio.wait({loser})
                    return Raced(results=(results[0], results[1]), winner=winners[0],
                                 hedged=True, lost_ms=lost_ms)  # fmt: skip
            ok = [i for i in (0, 1) if _ok(results[i])]
            return Raced(results=(results[0], results[1]), winner=ok[0] if ok else None,
                         hedged=True)  # fmt: skip
        finally:
            for task in tasks:  # torn down (cancelled): each side unwinds
                if not task.done():
                    task.cancel()
            leftover = [t for t in tasks if not t.done()]
            if leftover:
                await asyncio.wait(leftover)


# --- the trampolines ------------------------------------------------------------------------


class _Closing:
    """Shared by a :class:`SyncStream` and its generator (never a reference from the
    generator to its owner, so dropping the owner frees both at once): whether the
    close the generator sees came from ``close()``, and the context the stream was
    made in (its finalizer's cleanup runs in it)."""

    __slots__ = ("context", "explicit")

    def __init__(self) -> None:
        self.explicit = False
        self.context = contextvars.copy_context()


class _Core(Generic[T]):
    """A core on a trampoline: what it receives next (``value``, or ``exc`` thrown in)
    and, once it has returned or emitted, ``done``. The stepping of a core, written
    once for both trampolines; they only execute the effects it hands them."""

    __slots__ = ("core", "done", "exc", "gone", "value")

    def __init__(self, core: Steps[T], gone: bool) -> None:
        self.core = core
        self.gone = gone
        self.value: object = None
        self.exc: BaseException | None = ClientGone() if gone else None
        self.done: T | Emit

    def next_effect(self) -> Effect[object] | None:
        """The core's next effect to execute; None once it has returned or emitted an
        :class:`Emit` (an Emit is skipped when ``gone``: the core is cleaning up)."""
        while True:
            try:
                if self.exc is None:
                    effect = self.core.send(self.value)
                else:
                    effect = self.core.throw(self.exc)
            except StopIteration as stop:
                self.done = stop.value
                return None
            self.value, self.exc = None, None
            if not isinstance(effect, Emit):
                return effect
            if not self.gone:
                self.done = effect
                return None

    def failed(self, effect: Effect[object], err: BaseException) -> None:
        """``effect`` raised ``err``. Anything but an Exception tears the driver down:
        the core is abandoned and ``err`` re-raised. A quiet effect's Exception is
        logged and its fallback sent to the core; any other is raised into the core at
        its yield."""
        if not isinstance(err, Exception):
            _abandon(self.core)
            raise err
        if not effect.quiet:
            self.exc = err
            return
        logger.error(
            "%s failed (%s); routing goes on without it.",
            type(effect).__name__,
            type(err).__name__,
        )
        self.value = effect.fallback()


def _drive(core: Steps[T], ctx: Context, *, gone: bool = False) -> T | Emit:
    """The sync trampoline: run ``core``'s effects blocking until it returns (its value)
    or emits (the :class:`Emit`, for a stream driver to hand over; the next call resumes
    the core). ``gone``: start by throwing :class:`ClientGone` and skip the core's
    ``Emit`` effects (its cleanup; the core's ClientGone then propagates)."""
    run = _Core(core, gone)
    while (effect := run.next_effect()) is not None:
        try:
            run.value = effect.run(ctx)
        except BaseException as err:
            run.failed(effect, err)
    return run.done


def _drive_until(core: Steps[T], ctx: Context, stop: threading.Event) -> T:
    """:func:`_drive` for a :class:`Race` side in a worker thread: once ``stop`` is set
    (the other side won), the core gets :class:`ClientGone` at its next yield, runs its
    cleanup, and ClientGone is raised."""
    run = _Core(core, False)
    while (effect := run.next_effect()) is not None:
        try:
            run.value = effect.run(ctx)
        except BaseException as err:
            run.failed(effect, err)
        if stop.is_set() and not run.gone:
            run.gone, run.value, run.exc = True, None, ClientGone()
    done = run.done
    if isinstance(done, Emit):
        _unwind(core, ctx)
        raise TypeError(_NOT_A_STREAM)
    if run.gone:
        raise ClientGone()
    return done


def _unwind(core: Steps[object], ctx: Context) -> None:
    """Throw ClientGone into the core and execute its cleanup effects."""
    try:
        _drive(core, ctx, gone=True)
    except ClientGone:
        pass


async def _adrive(core: Steps[T], ctx: Context, *, gone: bool = False) -> T | Emit:
    """The async trampoline: :func:`_drive` with awaits. Cancelled during an effect, it
    unwinds the core, then re-raises (cancelled again while unwinding: it abandons)."""
    run = _Core(core, gone)
    while (effect := run.next_effect()) is not None:
        try:
            run.value = await effect.arun(ctx)
        except asyncio.CancelledError:
            if gone:  # cancelled again while cleaning up: stop here
                _abandon(core)
            else:
                await _aunwind(core, ctx)
            raise
        except BaseException as err:
            run.failed(effect, err)
    return run.done


async def _aunwind(core: Steps[object], ctx: Context) -> None:
    """:func:`_unwind` on the async trampoline."""
    try:
        await _adrive(core, ctx, gone=True)
    except ClientGone:
        pass


def _abandon(core: Steps[object]) -> None:
    """End a core without running its remaining effects (the driver itself is being
    torn down): ClientGone at each cleanup yield until the core has stopped, so it is
    never garbage-collected mid-cleanup."""
    for _ in range(64):
        try:
            core.throw(ClientGone())
        except (StopIteration, ClientGone):
            return
        except Exception:
            logger.exception("The routing core failed while being abandoned.")
            return


# --- the drivers --------------------------------------------------------------------------

_NOT_A_STREAM = "Emit is a stream driver's yield; run()/arun() drive cores that emit nothing."


def run(core: Steps[T], *, sleeper: Sleeper | None = None) -> T:
    """Drive ``core`` with blocking calls; its return value."""
    ctx = Context(sleeper=sleeper)
    done = _drive(core, ctx)
    if isinstance(done, Emit):
        _unwind(core, ctx)
        raise TypeError(_NOT_A_STREAM)
    return done


async def arun(core: Steps[T], *, sleeper: AsyncSleeper | None = None) -> T:
    """Drive ``core`` with awaits; its return value. Cancelled, it lets the core clean
    up (see :class:`ClientGone`) and re-raises the CancelledError."""
    ctx = Context(asleeper=sleeper)
    done = await _adrive(core, ctx)
    if isinstance(done, Emit):
        await _aunwind(core, ctx)
        raise TypeError(_NOT_A_STREAM)
    return done


class SyncStream(Iterator[Any]):
    """The sync stream driver's iterator. ``close()`` runs the core's cleanup here and
    now (the decision is recorded before it returns). Dropped without ``close()``, its
    generator is finalized by the garbage collector, at whatever code it interrupted:
    the cleanup then runs in a thread of its own (:func:`join_finalizers` waits for
    it), with ``Context.finalizing`` set (the record goes to the write-behind queue), in
    the context the stream was made in (so the request's budget grant is found and
    settled)."""

    __slots__ = ("_closing", "_gen")

    def __init__(self, core: Steps[None], ctx: Context) -> None:
        self._closing = _Closing()
        self._gen = _events(core, ctx, self._closing)

    def __iter__(self) -> SyncStream:
        return self

    def __next__(self) -> Any:
        return next(self._gen)

    def close(self) -> None:
        self._closing.explicit = True
        self._gen.close()


def stream(core: Steps[None], *, sleeper: Sleeper | None = None) -> SyncStream:
    """Drive a streaming ``core``: its :class:`Emit` events are this iterator's items.
    Closed early, the core gets :class:`ClientGone` and cleans up (see
    :class:`SyncStream` for one dropped without ``close()``)."""
    return SyncStream(core, Context(sleeper=sleeper))


def _events(core: Steps[None], ctx: Context, closing: _Closing) -> Generator[object, None, None]:
    """A streaming core's events, from the sync trampoline."""
    while isinstance(emitted := _drive(core, ctx), Emit):
        try:
            yield emitted.event
        except GeneratorExit:
            if closing.explicit:
                _unwind(core, ctx)
            else:  # the garbage collector's finalizer (see SyncStream)
                fin = Context(sleeper=ctx.sleeper, finalizing=True)
                _clean_up_elsewhere(closing.context, core, fin)
            raise


#: How many cleanups of dropped sync streams have not finished (:func:`join_finalizers`).
_cleanups_running = 0
_cleanups_done = threading.Condition()


def _clean_up_elsewhere(context: contextvars.Context, core: Steps[None], fin: Context) -> None:
    """A dropped sync stream's cleanup, off the thread the garbage collector
    interrupted: that thread may be anywhere — inside the cache client's connection-pool
    lock or a database driver's call — and the cleanup closes the upstream, observes the
    circuit, settles the budgets (cache calls) and hands the record on. It runs in a
    thread of its own, in the stream's context (a copy only entered there). Not a daemon:
    the interpreter waits for it before its exit handlers flush the write-behind queue.
    At interpreter shutdown, when no thread can start, it runs here."""
    global _cleanups_running
    with _cleanups_done:
        _cleanups_running += 1
    try:
        threading.Thread(
            target=_clean_up, args=(context, core, fin), name="llm-routing-stream-cleanup"
        ).start()
    except RuntimeError:  # "can't create new thread at interpreter shutdown"
        _clean_up(context, core, fin)


def _clean_up(context: contextvars.Context, core: Steps[None], fin: Context) -> None:
    global _cleanups_running
    try:
        context.run(_unwind, core, fin)
    finally:
        with _cleanups_done:
            _cleanups_running -= 1
            _cleanups_done.notify_all()


def join_finalizers(timeout: float | None = None) -> bool:
    """Wait until no cleanup of a dropped sync stream is running; whether that came
    within ``timeout`` seconds (tests, and a host that wants them done)."""
    with _cleanups_done:
        return _cleanups_done.wait_for(lambda: _cleanups_running == 0, timeout)


async def astream(
    core: Steps[None], *, sleeper: AsyncSleeper | None = None
) -> AsyncGenerator[Any, None]:
    """The async :func:`stream`, from the async trampoline: ``aclose()`` or a
    cancellation lets the core clean up."""
    ctx = Context(asleeper=sleeper)
    while isinstance(emitted := await _adrive(core, ctx), Emit):
        try:
            yield emitted.event
        except (GeneratorExit, asyncio.CancelledError):
            await _aunwind(core, ctx)
            raise
