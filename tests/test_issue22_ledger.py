"""Issue 22's ledger property (docs/testing.md, "The one exit, the stream key filter and
the ledger"): hypothesis drives requests through both drivers (sync and async), stream
and not, with an exception injected at every effect in turn (the configuration read,
the circuit, the upstream call, each stream read, the close, the backoff, the record,
the announcement) — on the async driver also a cancellation — and the client reading
everything, closing early, cancelling mid-stream or dropping the iterator. Afterwards:

* every request that reached the walk ended through the one exit exactly once
  (``request_routed`` once), and was recorded (a decision row, or handed to the
  write-behind queue when it could not be written inline);
* the tokens charged (what ``request_routed`` hands the budgets, and the budget's own
  counter) == the tokens the upstream reported;
* no key value in any event that left the router (the upstream echoes the key in text
  and in tool-call arguments, split across chunks);
* no place in flight is left in the budget's in-flight set;
* on real event loops (``llm_routing.achat`` under ``asyncio.run``, the router's
  database calls in worker threads): no thread, database connection, PostgreSQL
  session, Redis client or file descriptor left over (:class:`Leftovers`).

The sync-driver property runs the async driver through tests/drivers.py (non-stream
only: that harness keeps the router's database calls on the test's connection); the
async-stream property runs on committed rows instead. Each has a ``services`` variant
on PostgreSQL and Redis. Bounded (derandomized, few examples) so the embedded suite
stays fast. The upstream is the test adapter kind ``scripted`` (tests/conftest.py): in
process, so the injected effect is the only fault.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
import time
import traceback
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from django.db import connections
from django.db.backends.signals import connection_created
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import llm_routing
from llm_routing import budgets, effects, recorder, router
from llm_routing.cache import async_redis, raw_redis, routing_cache
from llm_routing.effects import Effect
from llm_routing.errors import UnavailableError
from llm_routing.models import Budget, RoutingDecision
from llm_routing.resilience import breaker
from llm_routing.signals import request_routed
from llm_routing.types import (
    AuditRequest,
    ProviderResult,
    StreamChunk,
    StreamEnd,
    StreamToolCallDelta,
    ToolCallDelta,
    Usage,
)

from .conftest import make_chain, make_provider

LEDGER = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
#: The services variants: the same cases, fewer of them (the real servers are slower).
LEDGER_SERVICES = settings(LEDGER, max_examples=40)
#: Async streams: a real event loop and worker threads per request.
LEDGER_ASYNC = settings(LEDGER, max_examples=60)


class Injected(Exception):
    """The fault put in place of one effect."""


def _concrete(cls: type[Effect]) -> Iterator[type[Effect]]:
    for sub in cls.__subclasses__():
        if "run" in vars(sub):
            yield sub
        yield from _concrete(sub)


class Ledger:
    """Wraps every effect: raises at the ``at``-th executed one; counts what the
    upstream reported and whether the request reached the walk."""

    def __init__(self) -> None:
        self.at = -1
        self.seen = 0
        self.reported = 0
        self.reached = False
        self.fault: type[BaseException] = Injected
        self.hit = ""  # the effect the fault replaced

    def reset(self, at: int, fault: type[BaseException]) -> None:
        self.at, self.seen, self.reported, self.reached = at, 0, 0, False
        self.fault = fault
        self.hit = ""

    def before(self, effect: Effect) -> None:
        if isinstance(effect, effects.Emit):
            return
        self.seen += 1
        if self.seen == self.at:
            self.hit = type(effect).__name__
            raise self.fault(self.hit)

    def after(self, effect: Effect, value: Any) -> None:
        if isinstance(effect, router.Setup):
            self.reached = True
        usage: Usage | None = None
        if isinstance(value, ProviderResult) and isinstance(effect, effects.Complete):
            usage = value.usage
        elif isinstance(value, StreamEnd):
            usage = value.usage
        if usage is not None:
            self.reported += usage.input_tokens + usage.output_tokens

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for cls in set(_concrete(Effect)):
            monkeypatch.setattr(cls, "run", self._run(cls.run))
            monkeypatch.setattr(cls, "arun", self._arun(cls.arun))

    def _run(self, original: Any) -> Any:
        def run(effect: Effect, ctx: Any) -> Any:
            self.before(effect)
            value = original(effect, ctx)
            self.after(effect, value)
            return value

        return run

    def _arun(self, original: Any) -> Any:
        async def arun(effect: Effect, ctx: Any) -> Any:
            self.before(effect)
            value = await original(effect, ctx)
            self.after(effect, value)
            return value

        return arun


@pytest.fixture
def ledger(
    scripted: Any, key_env: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Ledger, dict[str, Any]]]:
    a = make_provider("a", supports_streaming=True)
    make_chain("main", [a], is_default=True)
    # "failover": x fails (transient, before any token) and a serves.
    make_chain("failover", [make_provider("x", supports_streaming=True, max_retries=0), a])
    scripted.scripts["x"] = [UnavailableError("x is down.")]
    scripted.streams["x"] = [[UnavailableError("x is down.")]]
    key = key_env
    scripted.streams["a"] = [
        [
            "hello ",
            key[:6],
            key[6:] + " and ",
            StreamToolCallDelta(ToolCallDelta(0, id="call_1", name="lookup")),
            StreamToolCallDelta(ToolCallDelta(0, arguments='{"k": "' + key[:9])),
            StreamToolCallDelta(ToolCallDelta(0, arguments=key[9:] + '"}')),
            "END",
        ]
    ]
    book = Ledger()
    book.install(monkeypatch)
    state: dict[str, Any] = {"routed": [], "queued": [], "events": []}

    def on_routed(sender: Any, routed: Any, **kwargs: Any) -> None:
        state["routed"].append(routed)

    request_routed.connect(on_routed, dispatch_uid="test_issue22_ledger")
    monkeypatch.setattr(
        recorder, "submit", lambda request, routed: state["queued"].append(routed.request_id)
    )
    Budget.objects.create(name="everyone", scope="global", max_tokens=10**9, window="day")
    try:
        yield book, state
    finally:
        request_routed.disconnect(dispatch_uid="test_issue22_ledger")
        # A cancellation at the announcement sends it synchronously: on the async
        # driver its settlement task may be left on a loop that has closed since.
        for task in list(budgets._settling):
            if task.get_loop().is_closed():
                budgets._settling.discard(task)


def _drive(stream: bool, client: str, failover: bool = False) -> list[Any]:
    chain = "failover" if failover else None
    request = AuditRequest(task="t", input_text="x", stream=stream, chain=chain)
    if not stream:
        return [router.route(request)]
    events = router.route_stream(request)
    out: list[Any] = []
    if client == "all":
        out.extend(events)
        return out
    for event in events:
        out.append(event)
        break
    if client == "close":
        events.close()  # type: ignore[attr-defined]
    else:  # dropped without close(): the garbage collector finalizes it
        del events
        gc.collect()
        assert effects.join_finalizers(timeout=10)  # its cleanup runs in a thread of its own
    return out


def _tokens_charged() -> int:
    """The tokens counted in the global budget's current window (the real counter)."""
    return budgets.usage(Budget.objects.filter(name="everyone"))["everyone"].tokens


def _places_in_flight() -> int:
    """Requests holding a place in the global budget's in-flight set (a Redis sorted set,
    or a dict in the LocMem cache)."""
    budget = Budget.objects.get(name="everyone")
    key = budgets._key(budget, budgets._start(budget, budgets.clock()), "inflight")
    cache = routing_cache()
    client = raw_redis(cache)
    if client is not None:
        return int(client.zcard(cache.make_key(key)))
    return len(cache.get(key) or {})


def _keyless(events: list[Any], key: str) -> None:
    """No key value left the router, whole or split across chunks."""
    text = "".join(e.text for e in events if isinstance(e, StreamChunk))
    arguments = "".join(
        e.tool_call.arguments for e in events if isinstance(e, StreamChunk) and e.tool_call
    )
    assert key not in text and key not in arguments
    assert all(key not in repr(e) for e in events)


def _one_sync_driver_request(
    ledger: tuple[Ledger, dict[str, Any]],
    driver: str,
    key_env: str,
    at: int,
    stream: bool,
    client: str,
    cancel: bool,
    failover: bool = False,
) -> None:
    book, state = ledger
    state["routed"].clear()
    state["queued"].clear()
    book.reset(-1, Injected)  # no fault while x's circuit is reset (effects of their own)
    breaker.store.reset("x", "x-model")  # x fails on every call: its circuit stays closed
    # Async streams run in test_async_streams_… below (a real loop per request, the
    # router's off-loop calls in worker threads on committed rows). The harness of
    # tests/drivers.py (a private event loop per stream, the router's off-loop calls on
    # the test's own connection) leaks that connection into later event loops when a
    # stream is closed with a fault in its cleanup.
    if driver == "async" and stream:
        stream = False
    cancelled = cancel and driver == "async"
    book.reset(at, asyncio.CancelledError if cancelled else Injected)
    rows_before = RoutingDecision.objects.count()
    charged_before = _tokens_charged()
    refusal = budgets.check(None, None)  # the request's grant: a place in flight
    assert refusal is None
    try:
        events = _drive(stream, client, failover)
    except Injected:
        events = []
        # An exception ends a request only before its walk (the configuration read).
        assert not book.reached
    except asyncio.CancelledError:
        events = []  # a cancellation is re-raised once the request has ended
    finally:
        grant = budgets._current.get()
        budgets.forget()  # what the end of an HTTP request does
    note = (
        f"{driver} stream={stream} client={client} failover={failover} "
        f"{book.fault.__name__} at {book.hit}"
    )
    assert _places_in_flight() == 0, note
    if book.reached:  # the exit settled the grant (not the forget above)
        assert grant is None or grant.released, "the place in flight was not settled"
    if not book.reached:
        assert state["routed"] == [] and RoutingDecision.objects.count() == rows_before
        return
    # The one exit, exactly once.
    assert len(state["routed"]) == 1, note
    routed = state["routed"][0]
    recorded = RoutingDecision.objects.filter(request_id=routed.request_id).count()
    assert recorded + state["queued"].count(routed.request_id) == 1, note
    # Charged what the upstream reported: by the exit, and in the budget's counter.
    assert budgets._used(routed)[0] == book.reported, note
    assert _tokens_charged() - charged_before == book.reported, note
    _keyless(events, key_env)


SYNC_DRIVER_CASES = {
    "at": st.integers(min_value=0, max_value=20),
    "stream": st.booleans(),
    "client": st.sampled_from(["all", "close", "drop"]),
    "cancel": st.booleans(),
    "failover": st.booleans(),
}


@pytest.mark.django_db
@pytest.mark.usefixtures("driver")
@LEDGER
@given(**SYNC_DRIVER_CASES)
def test_every_request_that_reached_the_walk_is_recorded_charged_and_clean(
    ledger: tuple[Ledger, dict[str, Any]],
    driver: str,
    key_env: str,
    at: int,
    stream: bool,
    client: str,
    cancel: bool,
    failover: bool,
) -> None:
    """``cancel`` (async driver): the fault is a cancellation (``CancelledError`` at that
    effect, as when the server cancels the request's task) instead of an exception.
    ``failover``: a chain whose first candidate fails before any token."""
    _one_sync_driver_request(ledger, driver, key_env, at, stream, client, cancel, failover)


@pytest.mark.services
@pytest.mark.django_db
@pytest.mark.usefixtures("driver")
@LEDGER_SERVICES
@given(**SYNC_DRIVER_CASES)
def test_every_request_is_recorded_charged_and_clean_on_postgresql_and_redis(
    ledger: tuple[Ledger, dict[str, Any]],
    driver: str,
    key_env: str,
    at: int,
    stream: bool,
    client: str,
    cancel: bool,
    failover: bool,
) -> None:
    """The ledger above on PostgreSQL and Redis (the budget's Lua scripts, its in-flight
    sorted set, the routing cache's redis.asyncio client on the async driver)."""
    _one_sync_driver_request(ledger, driver, key_env, at, stream, client, cancel, failover)


# --- async streams, each request on its own event loop ---------------------------------


class Leftovers:
    """What a request could leave behind, counted after the garbage collector ran:
    threads, open file descriptors, database connections opened by the router's worker
    threads and still open, PostgreSQL sessions of this database, and event loops
    holding a redis.asyncio client of the routing cache.

    Allowed, and documented: the test's own database connection (its transaction or
    session), the routing cache's one sync ``redis.Redis`` pool (docs/production.md,
    "Caches and their staleness") and, for the async Redis client, the loop closed last
    (let go when the next loop asks for one, with the connections its pool opened).
    Each is reached by warm-up requests before the first count (the baseline is their
    highest count), so no count may go above it."""

    def __init__(self) -> None:
        self.opened: list[tuple[weakref.ReferenceType[Any], int, str]] = []
        self.main = threading.get_ident()

    def created(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        # Who opened it: the app's frames of the stack.
        where = "".join(f for f in traceback.format_stack() if "/llm_routing/" in f)
        self.opened.append((weakref.ref(connection), threading.get_ident(), where))

    def _open_in_workers(self) -> list[str]:
        """Where each connection opened off the test's thread and still open was opened
        (an in-memory SQLite database is never closed by Django: not counted)."""
        live = []
        for ref, ident, where in self.opened:
            wrapper = ref()
            if wrapper is None or ident == self.main or wrapper.connection is None:
                continue
            if wrapper.vendor == "sqlite" and wrapper.is_in_memory_db():
                continue
            live.append(where)
        return live

    def worker_connections(self) -> int:
        return len(self._open_in_workers())

    def assert_none_over(self, baseline: dict[str, int], note: str, *, collect: bool) -> None:
        """Nothing counted above ``baseline``. A PostgreSQL backend leaves
        ``pg_stat_activity`` a moment after its client closed: that count is read again
        (a bounded wait, never an assertion on time) until it is down or the wait ends."""
        counts = self.count(collect=collect)
        for _ in range(100):
            if counts.get("postgresql sessions", 0) <= baseline.get("postgresql sessions", 0):
                break
            time.sleep(0.05)
            counts = self.count(collect=collect)
        over = {k: (v, baseline[k]) for k, v in counts.items() if v > baseline[k]}
        opened = "".join(f"\nopened by:\n{where}" for where in self._open_in_workers())
        assert not over, f"left over (now, before): {over}; {note}{opened}"

    def count(self, *, collect: bool) -> dict[str, int]:
        """The counts; ``collect``: after a full garbage collection, and the open file
        descriptors too (a socket let go is closed by the collector). A collection is
        slow in a large test process: the ledger runs one per test, not per request."""
        counts = {
            "threads": threading.active_count(),
            "worker db connections": self.worker_connections(),
        }
        if collect:
            gc.collect()
            counts["worker db connections"] = self.worker_connections()
            if os.path.isdir("/proc/self/fd"):
                counts["fds"] = len(os.listdir("/proc/self/fd"))
        connection = connections["default"]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                )
                counts["postgresql sessions"] = int(cursor.fetchone()[0])
        aredis = async_redis(routing_cache())
        if aredis is not None:
            counts["loops holding a redis client"] = aredis.loops()
        return counts


@pytest.fixture
def leftovers() -> Iterator[Leftovers]:
    tracker = Leftovers()
    connection_created.connect(tracker.created, dispatch_uid="test_issue22_ledger_leftovers")
    try:
        yield tracker
    finally:
        connection_created.disconnect(dispatch_uid="test_issue22_ledger_leftovers")


MESSAGES = [{"role": "user", "content": "x"}]


async def _consume_async(stream: bool, client: str, out: list[Any]) -> None:
    """One request through ``llm_routing.achat``; the client reads everything, closes
    the stream after its first event (``aclose()``), cancels its reading task mid-stream,
    or drops the iterator after the first event (the loop's async-generator finalizer
    then closes it)."""
    if not stream:
        out.append(await llm_routing.achat(MESSAGES))
        return
    events = await llm_routing.achat(MESSAGES, stream=True)
    if client == "all":
        async for event in events:
            out.append(event)
        return
    if client == "cancel":
        first = asyncio.Event()

        async def read(events: AsyncIterator[Any]) -> None:
            async for event in events:
                out.append(event)
                first.set()

        task = asyncio.ensure_future(read(events))
        waiter = asyncio.ensure_future(first.wait())
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        task.cancel()  # at whatever the stream awaits next (or a no-op: it has ended)
        await asyncio.gather(task, waiter, return_exceptions=True)
        if task.cancelled():
            return
        task.result()  # a fault raised into the client: the caller sees it
        return
    async for event in events:
        out.append(event)
        break
    if client == "leave":  # returns holding it: dropped as the request's coroutine ends
        return
    if client == "aclose":
        await events.aclose()  # type: ignore[attr-defined]
        return
    del events  # dropped: the loop's finalizer hook schedules its aclose()
    current = asyncio.current_task()
    for _ in range(100):  # let the scheduled close run to its end (as a server's loop)
        await asyncio.sleep(0)
        pending = [t for t in asyncio.all_tasks() if t is not current]
        if not pending:
            break
        await asyncio.gather(*pending, return_exceptions=True)


async def _one_async_request(
    stream: bool, client: str, out: list[Any]
) -> tuple[budgets.Grant | None, BaseException | None]:
    """The request as an async view serves it: its budget check (a place in flight),
    the call, then the end of the request (``forget``)."""
    assert await budgets.acheck(None, None) is None
    grant = budgets._current.get()
    raised: BaseException | None = None
    try:
        await _consume_async(stream, client, out)
    except (Injected, asyncio.CancelledError) as exc:
        raised = exc
    finally:
        budgets.forget()
    return grant, raised


def _warm_up(ledger: tuple[Ledger, dict[str, Any]], leftovers: Leftovers) -> dict[str, int]:
    """A few requests (so the documented pools exist), then the baseline: the highest
    count seen after each."""
    book, _ = ledger
    book.reset(-1, Injected)
    counts = []
    for stream, client in ((True, "all"), (False, "all"), (True, "cancel")):
        asyncio.run(_one_async_request(stream, client, []))
        counts.append(leftovers.count(collect=True))
    return {k: max(c[k] for c in counts) for k in counts[0]}


def _one_async_stream_request(
    ledger: tuple[Ledger, dict[str, Any]],
    leftovers: Leftovers,
    baseline: dict[str, int],
    key_env: str,
    at: int,
    cancel: bool,
    stream: bool,
    client: str,
) -> None:
    book, state = ledger
    state["routed"].clear()
    state["queued"].clear()
    book.reset(at, asyncio.CancelledError if cancel else Injected)
    rows_before = RoutingDecision.objects.count()
    charged_before = _tokens_charged()
    events: list[Any] = []
    grant, raised = asyncio.run(_one_async_request(stream, client, events))
    note = f"async stream={stream} client={client} {book.fault.__name__} at {book.hit}"
    assert _places_in_flight() == 0, note
    if isinstance(raised, Injected):
        # An exception ends a request only before its walk (the configuration read).
        assert not book.reached, note
    leftovers.assert_none_over(baseline, note, collect=False)
    if not book.reached:
        assert state["routed"] == [] and RoutingDecision.objects.count() == rows_before, note
        return
    assert grant is None or grant.released, f"the place in flight was not settled: {note}"
    # The one exit, exactly once.
    assert len(state["routed"]) == 1, note
    routed = state["routed"][0]
    recorded = RoutingDecision.objects.filter(request_id=routed.request_id).count()
    assert recorded + state["queued"].count(routed.request_id) == 1, note
    assert RoutingDecision.objects.count() - rows_before == recorded, note
    # Charged what the upstream reported: by the exit, and in the budget's counter.
    assert budgets._used(routed)[0] == book.reported, note
    assert _tokens_charged() - charged_before == book.reported, note
    _keyless(events, key_env)


ASYNC_CASES = {
    "at": st.integers(min_value=0, max_value=20),
    "cancel": st.booleans(),
    "stream": st.booleans(),
    "client": st.sampled_from(["all", "aclose", "cancel", "drop", "leave"]),
}


@LEDGER_ASYNC
@given(**ASYNC_CASES)
def _async_requests(
    ledger: tuple[Ledger, dict[str, Any]],
    leftovers: Leftovers,
    baseline: dict[str, int],
    key_env: str,
    at: int,
    cancel: bool,
    stream: bool,
    client: str,
) -> None:
    _one_async_stream_request(ledger, leftovers, baseline, key_env, at, cancel, stream, client)


def _async_ledger(
    ledger: tuple[Ledger, dict[str, Any]], leftovers: Leftovers, key_env: str
) -> None:
    baseline = _warm_up(ledger, leftovers)
    _async_requests(ledger, leftovers, baseline, key_env)
    leftovers.assert_none_over(baseline, "after all the requests", collect=True)


@pytest.mark.django_db(transaction=True)
def test_async_streams_are_recorded_charged_clean_and_leave_nothing_behind(
    ledger: tuple[Ledger, dict[str, Any]], leftovers: Leftovers, key_env: str
) -> None:
    """``llm_routing.achat`` (stream or not), each request on its own event loop
    (``asyncio.run``) with the router's database calls in worker threads, an exception
    or a cancellation in place of each effect in turn, the client reading all, closing,
    cancelling mid-stream, dropping the iterator or returning with it unread: the
    ledger above after each request, and no thread, database connection or session
    and no Redis client left over (:class:`Leftovers`); after them all, no file
    descriptor either."""
    _async_ledger(ledger, leftovers, key_env)


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_async_streams_leave_nothing_behind_on_postgresql_and_redis(
    ledger: tuple[Ledger, dict[str, Any]], leftovers: Leftovers, key_env: str
) -> None:
    """The async ledger on PostgreSQL (its sessions counted in ``pg_stat_activity``) and
    Redis (the loops holding a redis.asyncio client: one per closed ``asyncio.run()``
    loop was kept for the life of the process)."""
    _async_ledger(ledger, leftovers, key_env)


# --- the HTTP face under ASGI: the client reads all or goes away -------------------------


async def _asgi_call(app: Any, token: str, body: dict[str, Any], client: str) -> tuple[int, bytes]:
    """One ``POST /v1/chat/completions`` to the ASGI application, as a server hands it
    over: the body, then ``http.disconnect`` once the response has ended — or, for
    ``client == "leave"``, as soon as the first body chunk has been sent (the client
    closed its connection mid-stream). (status, body bytes sent)."""
    payload = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"authorization", f"Token {token}".encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    gone = asyncio.Event()
    sent_body = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            if gone.is_set():
                raise OSError("the client has gone")  # as a server's closed transport
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False) or (client == "leave" and chunks[-1]):
                gone.set()

    await app(scope, receive, send)
    return status, b"".join(chunks)


@pytest.fixture
def http_token(django_user_model: Any) -> str:
    from rest_framework.authtoken.models import Token

    user = django_user_model.objects.create_user(username="ledger", password="pw-ledger-123")
    return str(Token.objects.create(user=user).key)


HTTP_CASES = {
    "at": st.integers(min_value=0, max_value=20),
    "cancel": st.booleans(),
    "stream": st.booleans(),
    "client": st.sampled_from(["all", "leave"]),
    # The token's cache emptied first: authentication, admission and the budget check
    # then run in a worker thread (else on the loop, answered from memory).
    "cold": st.booleans(),
}


@settings(LEDGER, max_examples=40)
@given(**HTTP_CASES)
# The first effect (the configuration read) failing or cancelled, admission in a worker
# thread: the request's place in flight was held until its lease.
@example(at=1, cancel=False, stream=False, client="all", cold=True)
@example(at=1, cancel=True, stream=True, client="all", cold=True)
def _http_requests(
    ledger: tuple[Ledger, dict[str, Any]],
    token: str,
    key_env: str,
    at: int,
    cancel: bool,
    stream: bool,
    client: str,
    cold: bool,
) -> None:
    from llm_routing.api.authentication import clear_token_cache
    from llm_routing.asgi import get_asgi_application

    if cold:
        clear_token_cache()
    book, state = ledger
    state["routed"].clear()
    state["queued"].clear()
    book.reset(at, asyncio.CancelledError if cancel else Injected)
    rows_before = RoutingDecision.objects.count()
    charged_before = _tokens_charged()
    flying_before = _places_in_flight()
    body = {"model": "main", "messages": MESSAGES, "stream": stream}
    try:
        status, sent = asyncio.run(_asgi_call(get_asgi_application(), token, body, client))
    except asyncio.CancelledError:  # the request's task was cancelled (the server's)
        status, sent = 0, b""
    note = (
        f"/v1 stream={stream} client={client} cold={cold} {book.fault.__name__} "
        f"at {book.hit}: {status}"
    )
    assert _places_in_flight() == flying_before == 0, note
    assert key_env not in sent.decode("utf-8", "replace"), note
    if not book.reached:
        assert state["routed"] == [] and RoutingDecision.objects.count() == rows_before, note
        return
    assert len(state["routed"]) == 1, note
    routed = state["routed"][0]
    recorded = RoutingDecision.objects.filter(request_id=routed.request_id).count()
    assert recorded + state["queued"].count(routed.request_id) == 1, note
    assert budgets._used(routed)[0] == book.reported, note
    assert _tokens_charged() - charged_before == book.reported, note


@pytest.mark.django_db(transaction=True)
def test_the_asgi_face_records_charges_and_releases_whatever_the_client_does(
    ledger: tuple[Ledger, dict[str, Any]], http_token: str, key_env: str
) -> None:
    """``POST /v1/chat/completions`` (stream and not) through the project's ASGI
    application, each request on its own loop: a fault or a cancellation at each effect
    in turn, the client reading the whole answer or going away after the first body
    chunk. The ledger: one exit, one row, charged what the upstream reported, no place
    left in flight (the end of the HTTP request releases a grant the router never
    settled), and no key value in any byte sent."""
    _http_requests(ledger, http_token, key_env)


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_the_asgi_face_ledger_on_postgresql_and_redis(
    ledger: tuple[Ledger, dict[str, Any]], http_token: str, key_env: str
) -> None:
    """The ASGI face's ledger on PostgreSQL and Redis (the token cache, throttles and
    budgets on Redis: the admission answered from memory on the loop is the common
    case there)."""
    _http_requests(ledger, http_token, key_env)
