"""Run the router's sync-facing tests against the async driver too.

``route`` / ``route_stream`` stand-ins with the sync signatures that drive
:func:`~llm_routing.router.aroute` / :func:`~llm_routing.router.aroute_stream` on an
event loop in the test's own thread (one loop per call, one per stream for its whole
life, so ``close()`` mid-stream is the async generator's ``aclose()``). A sync sleeper
is handed over as an async one.

The database: the async drivers run their two blocking database calls (the session's
setup and the decision's record) off the loop, in a worker thread; a worker thread's
connection cannot see the test's uncommitted transaction, so here they run inline, in
the test's thread, on the test's connection (``routing.walk._off_loop``), with Django's
async-safety check lifted for that. tests/test_router_async.py runs the real
worker-thread path on committed rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from django.db import connections

from llm_routing import router, snapshot
from llm_routing.routing import plan, walk
from llm_routing.types import AuditRequest, RouterStreamEvent, RoutingResult

T = TypeVar("T")

DRIVERS = ("sync", "async")


def _async_sleeper(sleeper: Callable[[float], None] | None) -> Any:
    if sleeper is None:
        return None

    async def asleep(seconds: float) -> None:
        sleeper(seconds)

    return asleep


def _in_test_thread(held: dict[str, Any]) -> Callable[..., Any]:
    """``routing.walk._off_loop`` here: the call runs inline (the loop runs in the test's
    thread) on the test's own database connections (``held``, taken outside the loop)."""

    def off_loop(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
        async def call(*args: Any, **kwargs: Any) -> T:
            for alias, connection in held.items():
                connections[alias] = connection  # per task: the loop has its own locals
            return fn(*args, **kwargs)

        return call

    return off_loop


def route(
    request: AuditRequest,
    *,
    request_id: str | None = None,
    sleeper: Callable[[float], None] | None = None,
    persist: bool = True,
) -> RoutingResult:
    """``route`` through ``aroute``."""
    return asyncio.run(
        router.aroute(
            request, request_id=request_id, sleeper=_async_sleeper(sleeper), persist=persist
        )
    )


def route_stream(
    request: AuditRequest,
    *,
    request_id: str | None = None,
    sleeper: Callable[[float], None] | None = None,
    persist: bool = True,
    stream_mode: str | None = None,
) -> Iterator[RouterStreamEvent]:
    """``route_stream`` through ``aroute_stream``, one event per ``next()``."""
    loop = asyncio.new_event_loop()
    events: AsyncIterator[RouterStreamEvent] = router.aroute_stream(
        request,
        request_id=request_id,
        sleeper=_async_sleeper(sleeper),
        persist=persist,
        stream_mode=stream_mode,
    )
    try:
        while True:
            try:
                event = loop.run_until_complete(anext(events))
            except StopAsyncIteration:
                return
            yield event
    finally:
        loop.run_until_complete(events.aclose())  # type: ignore[attr-defined]
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def use(driver: str, module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point ``module``'s ``route`` / ``route_stream`` (and the router's own, for
    imports inside tests) at ``driver``."""
    if driver == "sync":
        return
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    held = {alias: connections[alias] for alias in connections}
    off_loop = _in_test_thread(held)
    monkeypatch.setattr(walk, "_off_loop", off_loop)

    async def acurrent_here() -> snapshot.ConfigSnapshot:
        # The snapshot's rebuild reads the test's (uncommitted) rows: on its connection.
        return await off_loop(snapshot.checked)()

    monkeypatch.setattr(plan, "acurrent", acurrent_here)
    for name, stand_in in (("route", route), ("route_stream", route_stream)):
        monkeypatch.setattr(router, name, stand_in)
        if hasattr(module, name):
            monkeypatch.setattr(module, name, stand_in)
