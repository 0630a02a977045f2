"""The effect protocol of the routing core, and its two drivers (sync and async).

The routing algorithm (the walk in :mod:`llm_routing.router`, the retry loop in
:mod:`llm_routing.resilience.retry`) is written once, as generators that never do I/O:
they ``yield`` an :class:`Effect` describing what they need done and receive its result
through ``send()`` (or its exception through ``throw()``). Composition is ``yield from``.

A driver does nothing but execute effects: :func:`run` / :func:`stream` call
:meth:`Effect.run` (blocking calls: ``adapter.complete``, ``time.sleep``, ``next(it)``);
:func:`arun` / :func:`astream` await :meth:`Effect.arun` (``await adapter.acomplete``,
``asyncio.sleep``, ``await it.__anext__()``). Each effect knows its own sync and async
execution, so effects of other layers (the breaker's ``Allow`` / ``Observe``, the
router's ``Record``) live beside the code they call and the drivers stay generic.

Client disconnect: a stream driver that sees its caller go away (``GeneratorExit`` on
the sync generator; ``aclose()`` or ``CancelledError`` on the async one) throws
:class:`ClientGone` into the core, executes the effects of the core's cleanup (close
the upstream, free a probe slot, record the decision), then re-raises the original
exception. ``ClientGone`` derives from BaseException so no ``except Exception`` in the
core (an adapter-bug guard) can swallow it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

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
    "Sleep",
    "Sleeper",
    "Steps",
    "SyncStream",
    "arun",
    "astream",
    "run",
    "stream",
]

logger = logging.getLogger("llm_routing.effects")

T = TypeVar("T")
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


class Effect:
    """One piece of I/O the core asks for. ``run`` executes it blocking, ``arun``
    awaiting; both return the value the core receives (or raise into the core).

    A *quiet* effect is bookkeeping whose failure must not change the request's
    outcome (the breaker's ``Allow`` / ``Observe``, closing a stream): the drivers log
    its exception and hand the core :meth:`fallback` instead of raising into it."""

    __slots__ = ()
    quiet: ClassVar[bool] = False

    def fallback(self) -> Any:
        """What the core receives when a quiet effect failed."""
        return None

    def run(self, ctx: Context) -> Any:
        raise NotImplementedError

    async def arun(self, ctx: Context) -> Any:
        raise NotImplementedError


#: A core generator: yields effects, receives their results, returns a T.
Steps = Generator[Effect, Any, T]


@dataclass(frozen=True, slots=True)
class Sleep(Effect):
    """Wait ``seconds`` (a retry's backoff) → None."""

    seconds: float

    def run(self, ctx: Context) -> None:
        (time.sleep if ctx.sleeper is None else ctx.sleeper)(self.seconds)

    async def arun(self, ctx: Context) -> None:
        await (asyncio.sleep if ctx.asleeper is None else ctx.asleeper)(self.seconds)


@dataclass(frozen=True, slots=True)
class Complete(Effect):
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
class OpenStream(Effect):
    """Open a stream → an opaque handle (a sync iterator for the sync driver, an
    async iterator for the async one) that only :class:`NextEvent` and
    :class:`CloseStream` look into."""

    adapter: BaseProvider
    request: AuditRequest
    api_key: str | None
    timeout: float

    def run(self, ctx: Context) -> Iterator[StreamEvent]:
        return iter(self.adapter.stream(self.request, api_key=self.api_key, timeout=self.timeout))

    async def arun(self, ctx: Context) -> AsyncIterator[StreamEvent]:
        return aiter(self.adapter.astream(self.request, api_key=self.api_key, timeout=self.timeout))


@dataclass(frozen=True, slots=True)
class NextEvent(Effect):
    """The stream's next event → StreamEvent, or None once it is exhausted."""

    handle: Any

    def run(self, ctx: Context) -> StreamEvent | None:
        return next(self.handle, None)

    async def arun(self, ctx: Context) -> StreamEvent | None:
        try:
            return await anext(self.handle)
        except StopAsyncIteration:
            return None


@dataclass(frozen=True, slots=True)
class CloseStream(Effect):
    """Close a stream (stops the upstream request) → None; never raises."""

    handle: Any
    quiet: ClassVar[bool] = True

    def run(self, ctx: Context) -> None:
        close = getattr(self.handle, "close", None)
        try:
            if close is not None:
                close()
        except Exception as exc:  # a closing error must not mask the outcome
            logger.warning("Closing an upstream stream failed (%s).", type(exc).__name__)

    async def arun(self, ctx: Context) -> None:
        aclose = getattr(self.handle, "aclose", None)
        try:
            if aclose is not None:
                await aclose()
        except Exception as exc:
            logger.warning("Closing an upstream stream failed (%s).", type(exc).__name__)


@dataclass(frozen=True, slots=True)
class Emit(Effect):
    """Hand one event to the stream's caller → None. Only stream drivers execute it
    (it is their ``yield``); after :class:`ClientGone` it is ignored."""

    event: Any

    def run(self, ctx: Context) -> None:
        raise TypeError("Emit is a stream driver's yield, not an executable effect.")

    async def arun(self, ctx: Context) -> None:
        raise TypeError("Emit is a stream driver's yield, not an executable effect.")


# --- drivers ------------------------------------------------------------------------------


def _failed(effect: Effect, err: Exception) -> tuple[Any, Exception | None]:
    """(value, exception) for the core after ``effect`` raised ``err``: a quiet effect's
    fallback (logged), else the exception, raised into the core at its yield."""
    if not effect.quiet:
        return None, err
    logger.error(
        "%s failed (%s); routing goes on without it.", type(effect).__name__, type(err).__name__
    )
    return effect.fallback(), None


def _step(core: Steps[T], value: Any, exc: BaseException | None) -> Effect:
    return core.throw(exc) if exc is not None else core.send(value)


def run(core: Steps[T], *, sleeper: Sleeper | None = None) -> T:
    """Drive ``core`` with blocking calls; its return value."""
    ctx = Context(sleeper=sleeper)
    value: Any = None
    exc: BaseException | None = None
    while True:
        try:
            effect = _step(core, value, exc)
        except StopIteration as stop:
            return stop.value
        value, exc = None, None
        try:
            value = effect.run(ctx)
        except Exception as err:  # raised into the core at its yield
            value, exc = _failed(effect, err)
        except BaseException:
            _abandon(core)
            raise


async def arun(core: Steps[T], *, sleeper: AsyncSleeper | None = None) -> T:
    """Drive ``core`` with awaits; its return value. Cancelled, it lets the core clean
    up (see :class:`ClientGone`) and re-raises the CancelledError."""
    ctx = Context(asleeper=sleeper)
    value: Any = None
    exc: BaseException | None = None
    while True:
        try:
            effect = _step(core, value, exc)
        except StopIteration as stop:
            return stop.value
        value, exc = None, None
        try:
            value = await effect.arun(ctx)
        except asyncio.CancelledError:
            await _aunwind(core, ctx)
            raise
        except Exception as err:
            value, exc = _failed(effect, err)
        except BaseException:
            _abandon(core)
            raise


class _Closing:
    """Shared by a :class:`SyncStream` and its driver generator (never a reference
    from the generator to its owner, so dropping the owner frees both at once):
    whether the close the generator sees came from ``close()``, and the context the
    stream was made in (its finalizer's cleanup runs in it)."""

    __slots__ = ("context", "explicit")

    def __init__(self) -> None:
        self.explicit = False
        self.context = contextvars.copy_context()


class SyncStream(Iterator[Any]):
    """The sync stream driver's iterator. ``close()`` runs the core's cleanup here and
    now (the decision is recorded before it returns). Dropped without ``close()``, the
    driver generator is finalized by the garbage collector, at whatever code it
    interrupted: the cleanup then runs with ``Context.finalizing`` set (no database
    write from a finalizer: the record goes to the write-behind queue), in the context
    the stream was made in (so the request's budget grant is found and settled)."""

    __slots__ = ("_closing", "_gen")

    def __init__(self, core: Steps[None], ctx: Context) -> None:
        self._closing = _Closing()
        self._gen = _drive_stream(core, ctx, self._closing)

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


def _drive_stream(core: Steps[None], ctx: Context, closing: _Closing) -> Generator[Any, None, None]:
    value: Any = None
    exc: BaseException | None = None
    while True:
        try:
            effect = _step(core, value, exc)
        except StopIteration:
            return
        value, exc = None, None
        if isinstance(effect, Emit):
            try:
                yield effect.event
            except GeneratorExit:
                if closing.explicit:
                    _unwind(core, ctx)
                else:  # the garbage collector's finalizer (see SyncStream)
                    fin = Context(sleeper=ctx.sleeper, finalizing=True)
                    closing.context.run(_unwind, core, fin)  # a copy only entered here
                raise
            continue
        try:
            value = effect.run(ctx)
        except Exception as err:
            value, exc = _failed(effect, err)
        except BaseException:
            _abandon(core)
            raise


async def astream(
    core: Steps[None], *, sleeper: AsyncSleeper | None = None
) -> AsyncGenerator[Any, None]:
    """The async :func:`stream`: ``aclose()`` or a cancellation lets the core clean up."""
    ctx = Context(asleeper=sleeper)
    value: Any = None
    exc: BaseException | None = None
    while True:
        try:
            effect = _step(core, value, exc)
        except StopIteration:
            return
        value, exc = None, None
        if isinstance(effect, Emit):
            try:
                yield effect.event
            except (GeneratorExit, asyncio.CancelledError):
                await _aunwind(core, ctx)
                raise
            continue
        try:
            value = await effect.arun(ctx)
        except asyncio.CancelledError:
            await _aunwind(core, ctx)
            raise
        except Exception as err:
            value, exc = _failed(effect, err)
        except BaseException:
            _abandon(core)
            raise


def _unwind(core: Steps[Any], ctx: Context) -> None:
    """Throw ClientGone into the core and execute its cleanup effects."""
    value: Any = None
    exc: BaseException | None = ClientGone()
    while True:
        try:
            effect = _step(core, value, exc)
        except (StopIteration, ClientGone):
            return
        value, exc = None, None
        if isinstance(effect, Emit):
            continue
        try:
            value = effect.run(ctx)
        except Exception as err:
            value, exc = _failed(effect, err)
        except BaseException:
            _abandon(core)
            raise


def _abandon(core: Steps[Any]) -> None:
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


async def _aunwind(core: Steps[Any], ctx: Context) -> None:
    value: Any = None
    exc: BaseException | None = ClientGone()
    while True:
        try:
            effect = _step(core, value, exc)
        except (StopIteration, ClientGone):
            return
        value, exc = None, None
        if isinstance(effect, Emit):
            continue
        try:
            value = await effect.arun(ctx)
        except Exception as err:
            value, exc = _failed(effect, err)
        except BaseException:  # cancelled again while cleaning up: stop here
            _abandon(core)
            raise
