"""Hedged streams on both drivers, against the fake upstream (docs/strategies.md
"Hedging"): a stream's attempt ends at its first token (``atomic``: its whole answer),
so that is what the hedge races. The hedge wins (its text is delivered, the primary's
connection closed) or loses, a hedge skipped for the attempt budget or the deadline,
the first attempt failing while the hedge runs, no hedge for a first token in time; the
loser recorded as ``hedge_lost`` and never counted on its circuit.

Delays are generous and only their order matters (a slow first token of 2 s against a
hedge after 100 ms); nothing here times anything. A slow upstream counts a client that
closes the connection while it waits to send the first token (the event loop's loser is
cancelled then), and sends its chunks 50 ms apart, so it also sees a close that comes
after the first token (the sync driver's loser cannot be interrupted: it closes its
stream once it has opened it)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, ClassVar

import pytest
from django.test import override_settings

from llm_routing import balance, budgets
from llm_routing.models import Attempt, Budget, Chain, ChainEntry, Provider, RoutingDecision
from llm_routing.providers import registry
from llm_routing.providers.base import BaseProvider
from llm_routing.router import route_stream
from llm_routing.routing.walk import _Hold
from llm_routing.types import (
    AuditRequest,
    StreamChunk,
    StreamDelta,
    StreamEnd,
    StreamEvent,
    StreamFailure,
    StreamResult,
    Usage,
)
from tests.fakes.upstream import FakeUpstream, Faults
from tests.support import wait_for
from tests.test_hedging import called, chain, failures, hedges, walk

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("driver", "key_env")]

REQUEST = AuditRequest(task="chat", input_text="Hedge the slow first tokens.", stream=True)
TEXT = {"a": "alpha answers here", "b": "bravo answers here", "c": "charlie answers here"}


@pytest.fixture(autouse=True)
def _fresh_latencies() -> Iterator[None]:
    balance.reset()
    yield
    balance.reset()


@pytest.fixture(autouse=True)
def _metrics(settings: Any) -> None:
    settings.LLM_ROUTING = {**settings.LLM_ROUTING, "METRICS_TOKEN": "t" * 32}


def streams(
    fake: FakeUpstream, hedge: str = "100", names: tuple[str, ...] = ("a", "b"), mode: str = ""
) -> Chain:
    """:func:`tests.test_hedging.chain`, its providers streaming (``mode``: the chain's
    stream_mode)."""
    row = chain(fake, hedge=hedge, names=names)
    Provider.objects.update(supports_streaming=True)
    if mode:
        Chain.objects.filter(pk=row.pk).update(stream_mode=mode)
    return row


def answer(name: str, **script: Any) -> Any:
    """Provider ``name``'s streamed answer (its own text, one word a chunk)."""
    return Faults.stream(text=TEXT[name], **script)


def slow(name: str, first: float) -> Any:
    """A first token after ``first`` seconds (a client that closes the connection
    meanwhile is counted at once), then a chunk every 50 ms."""
    return answer(name, first_chunk_delay=first, interval=0.05, watch=True)


def run(
    at_end: Callable[[], object] = lambda: None, **kwargs: Any
) -> tuple[str, set[str], StreamResult | StreamFailure]:
    """The text delivered, who the chunks came from, and the final event (``at_end``
    is called as it arrives)."""
    text: list[str] = []
    sources: set[str] = set()
    last: Any = None
    for event in route_stream(REQUEST, **kwargs):
        if isinstance(event, StreamChunk):
            text.append(event.text)
            sources.add(event.provider)
        else:
            at_end()
            last = event
    assert isinstance(last, StreamResult | StreamFailure)
    return "".join(text), sources, last


def closed(fake: FakeUpstream, count: int = 1) -> bool:
    return wait_for(lambda: fake.disconnects == count, 10.0)


def test_the_hedge_wins_with_its_first_token_and_the_primary_is_closed(
    fake_upstream: FakeUpstream,
) -> None:
    streams(fake_upstream)
    fake_upstream.script("openai", slow("a", 2.0))
    fake_upstream.script("anthropic", answer("b"))
    won = hedges("won")
    text, sources, last = run()
    assert isinstance(last, StreamResult)
    routed = last.routed
    assert text == TEXT["b"] and sources == {"b"}
    assert routed.result.ok and routed.result.provider == "b" and routed.result.output == text
    assert walk(routed) == [("a", "hedge_lost", "hedge_lost"), ("b", "ok", None)]
    assert routed.metadata.hedge == "won" and not routed.metadata.fallback_used
    assert routed.result.usage is not None and routed.result.usage.output_tokens > 0
    assert called(fake_upstream) == ["a", "b"]
    rows = Attempt.objects.filter(decision=RoutingDecision.objects.get()).order_by("index")
    assert [(r.provider, r.outcome, r.served) for r in rows] == [
        ("a", "hedge_lost", False),
        ("b", "ok", True),
    ]
    assert closed(fake_upstream), "the primary's stream was left open"
    assert failures("a") == 0  # a cancelled loser is no failure of its circuit
    assert hedges("won") == won + 1


def test_the_hedge_loses_when_the_primary_s_first_token_comes_first(
    fake_upstream: FakeUpstream,
) -> None:
    streams(fake_upstream)
    fake_upstream.script("openai", answer("a", first_chunk_delay=0.6))
    fake_upstream.script("anthropic", slow("b", 2.0))
    lost = hedges("lost")
    text, sources, last = run()
    assert isinstance(last, StreamResult)
    routed = last.routed
    assert text == TEXT["a"] and sources == {"a"} and routed.result.provider == "a"
    # The served attempt is not the last one recorded: the loser's row follows it.
    assert walk(routed) == [("a", "ok", None), ("b", "hedge_lost", "hedge_lost")]
    assert [a.served for a in routed.metadata.attempts] == [True, False]
    assert routed.result.usage is not None and routed.result.usage.output_tokens > 0
    assert routed.metadata.hedge == "lost" and hedges("lost") == lost + 1
    assert called(fake_upstream) == ["a", "b"]
    assert closed(fake_upstream), "the hedge's stream was left open"
    assert failures("b") == 0


def test_no_hedge_when_the_first_token_comes_in_time(fake_upstream: FakeUpstream) -> None:
    # The rest of the answer may take long: a direct stream's attempt ends at its first
    # token, and that came before the hedge was due.
    streams(fake_upstream, hedge="300")
    fake_upstream.script("openai", answer("a", interval=0.15))
    text, _, last = run()
    assert text == TEXT["a"] and isinstance(last, StreamResult)
    assert walk(last.routed) == [("a", "ok", None)]
    assert last.routed.metadata.hedge is None
    assert called(fake_upstream) == ["a"]


def test_an_atomic_stream_hedges_its_whole_answer(fake_upstream: FakeUpstream) -> None:
    # The same slow answer in atomic mode: buffered to its end before it is served, so
    # the hedge races the whole answer and wins with its own.
    streams(fake_upstream, hedge="300", mode="atomic")
    fake_upstream.script("openai", answer("a", interval=1.0))
    fake_upstream.script("anthropic", answer("b"))
    text, sources, last = run()
    assert text == TEXT["b"] and sources == {"b"} and isinstance(last, StreamResult)
    assert walk(last.routed) == [("a", "hedge_lost", "hedge_lost"), ("b", "ok", None)]
    assert last.routed.metadata.hedge == "won"
    assert closed(fake_upstream)
    assert failures("a") == 0


def test_a_primary_failing_while_the_hedge_runs_leaves_the_hedge_as_the_next_attempt(
    fake_upstream: FakeUpstream,
) -> None:
    streams(fake_upstream, names=("a", "b", "c"))
    fake_upstream.script("openai", dataclasses.replace(Faults.unavailable("openai"), delay=0.3))
    fake_upstream.script("anthropic", answer("b", first_chunk_delay=1.0))
    text, sources, last = run()
    assert text == TEXT["b"] and sources == {"b"} and isinstance(last, StreamResult)
    routed = last.routed
    assert [(p, o) for p, o, _ in walk(routed)] == [("a", "error"), ("b", "ok")]
    assert routed.metadata.hedge == "won"
    assert routed.metadata.fallback_used  # the primary failed: b is a fallback
    assert routed.metadata.fallback_reason == routed.metadata.attempts[0].reason
    assert called(fake_upstream) == ["a", "b"]  # no second call to b, none to c
    assert failures("a") == 1  # a real failure still counts


def test_no_hedge_when_the_attempt_budget_is_spent(fake_upstream: FakeUpstream) -> None:
    streams(fake_upstream)
    fake_upstream.script("openai", answer("a", first_chunk_delay=0.6))
    with override_settings(LLM_ROUTING={"MAX_ATTEMPTS": 1}):
        text, _, last = run()
    assert text == TEXT["a"] and isinstance(last, StreamResult)
    assert walk(last.routed) == [("a", "ok", None), ("b", "hedge_skipped", "attempt_budget")]
    assert last.routed.metadata.hedge == "skipped"
    assert called(fake_upstream) == ["a"]


def test_no_hedge_when_the_deadline_cannot_afford_it(
    fake_upstream: FakeUpstream, settings: Any
) -> None:
    # At 600 ms, 400 ms are left: less than the hedge delay itself.
    skipped = hedges("skipped")
    streams(fake_upstream, hedge="600")
    fake_upstream.script("openai", slow("a", 3.0))
    with override_settings(LLM_ROUTING={**settings.LLM_ROUTING, "REQUEST_DEADLINE_S": 1.0}):
        _, _, last = run()
    assert ("b", "hedge_skipped", "deadline") in walk(last.routed)
    assert last.routed.metadata.hedge == "skipped" and hedges("skipped") == skipped + 1
    assert called(fake_upstream) == ["a"]


def test_no_hedge_without_hedge_after_ms(fake_upstream: FakeUpstream) -> None:
    streams(fake_upstream, hedge="")
    fake_upstream.script("openai", answer("a", first_chunk_delay=0.4))
    text, _, last = run()
    assert text == TEXT["a"] and isinstance(last, StreamResult)
    assert walk(last.routed) == [("a", "ok", None)]
    assert last.routed.metadata.hedge is None
    assert called(fake_upstream) == ["a"]


class Racer(BaseProvider):
    """Two streams that reach their first token together: the primary's (``a``) waits
    until the hedge's (``b``) has started. Both open, so the walk itself releases the
    loser (the drivers cannot cancel a side that has already answered)."""

    kind: ClassVar[str] = "racer"
    requires_key: ClassVar[bool] = False
    go: ClassVar[threading.Event] = threading.Event()
    ago: ClassVar[asyncio.Event | None] = None
    cut: ClassVar[list[str]] = []  # streams closed before their end

    def complete(self, request: AuditRequest, *, api_key: str | None, timeout: float) -> Any:
        raise NotImplementedError

    def _events(self) -> list[StreamEvent]:
        name = self.config.name
        usage = Usage(input_tokens=2, output_tokens=2)
        return [StreamDelta(f"{name} "), StreamDelta("answers"), StreamEnd("stop", usage=usage)]

    def stream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> Iterator[StreamEvent]:
        ended = False
        try:
            if self.config.name == "a":
                Racer.go.wait(10)
            Racer.go.set()
            for event in self._events():
                ended = isinstance(event, StreamEnd)
                yield event
        except GeneratorExit:
            if not ended:
                Racer.cut.append(self.config.name)
            raise

    async def astream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> AsyncIterator[StreamEvent]:
        ended = False
        go = Racer.ago = Racer.ago or asyncio.Event()
        try:
            if self.config.name == "a":
                await go.wait()
            go.set()
            for event in self._events():
                ended = isinstance(event, StreamEnd)
                yield event
        except GeneratorExit:
            if not ended:
                Racer.cut.append(self.config.name)
            raise


@pytest.fixture
def racers() -> Iterator[None]:
    registry.register("racer", Racer)
    Racer.go, Racer.ago, Racer.cut = threading.Event(), None, []
    row = Chain.objects.create(name="main", is_default=True, hedge_after_ms="100")
    for position, name in enumerate(("a", "b")):
        provider = Provider.objects.create(
            name=name, kind="racer", model=name, supports_streaming=True, max_retries=0
        )
        ChainEntry.objects.create(chain=row, provider=provider, position=position)
    yield
    registry.clear_adapter_cache()


@pytest.mark.usefixtures("racers")
def test_a_loser_that_had_opened_its_stream_too_is_closed_once_and_recorded_lost(
    driver: str, caplog: pytest.LogCaptureFixture
) -> None:
    cut_by_the_end: list[str] = []
    text, sources, last = run(at_end=lambda: cut_by_the_end.extend(Racer.cut))
    assert isinstance(last, StreamResult)
    if driver == "async":  # both opened at once: the walk closed the loser before serving
        assert cut_by_the_end == [{"a": "b", "b": "a"}[last.routed.result.provider]]
    # Its circuit was told of the cancel without a hitch (a quiet effect that fails logs).
    assert not [r for r in caplog.records if r.name == "llm_routing.effects"]
    routed = last.routed
    won = routed.result.provider
    lost = {"a": "b", "b": "a"}[won]
    assert text == f"{won} answers" and sources == {won}
    outcomes = {p: (o, r) for p, o, r in walk(routed)}
    assert outcomes == {won: ("ok", None), lost: ("hedge_lost", "hedge_lost")}
    assert routed.metadata.hedge == ("won" if won == "b" else "lost")
    assert wait_for(lambda: Racer.cut == [lost], 10.0), Racer.cut  # closed, and once
    assert failures(lost) == 0 and failures(won) == 0


def test_a_hold_released_by_the_walk_or_by_its_side_exactly_once() -> None:
    published: list[str] = []
    released: list[str] = []

    def release() -> Iterator[Any]:
        released.append("released")
        yield from ()

    kept = _Hold()
    assert kept.keep(lambda: published.append("kept"), release) is True
    assert _drive(kept.lose()) is True and released == ["released"]
    assert _drive(kept.lose()) is False and released == ["released"]  # not twice
    late = _Hold()
    assert _drive(late.lose()) is False  # nothing kept yet: nothing to release
    assert late.keep(lambda: published.append("late"), release) is False
    assert published == ["kept"] and released == ["released"]  # the side releases it


def _drive(steps: Any) -> Any:
    """Run a core that yields no effect to its end (its return value)."""
    try:
        while True:
            next(steps)
    except StopIteration as stop:
        return stop.value


@pytest.fixture
def atomic_racers(racers: None) -> Iterator[None]:
    """:func:`racers` buffering their whole answers (``atomic``), the request admitted
    under a global tokens budget (as the views admit it before the walk)."""
    Chain.objects.filter(name="main").update(stream_mode="atomic")
    Budget.objects.create(name="cap", scope="global", max_tokens=100_000, window="day")
    budgets.reset_cache_state()
    assert budgets.check(None) is None
    yield
    budgets.forget()


@pytest.mark.usefixtures("atomic_racers")
def test_an_atomic_loser_with_its_whole_answer_is_recorded_and_charged_with_its_usage(
    driver: str,
) -> None:
    # Both racers buffer their whole answer (2 + 2 tokens each) at once; the walk
    # releases the one that did not win. It had its usage: its hedge_lost row carries
    # it, and the budget is charged for both answers.
    text, _, last = run()
    assert isinstance(last, StreamResult)
    routed = last.routed
    won = routed.result.provider
    lost = {"a": "b", "b": "a"}[won]
    assert text == f"{won} answers"
    rows = {a.provider: a for a in routed.metadata.attempts}
    assert rows[lost].outcome == "hedge_lost" and not rows[lost].served
    if rows[lost].usage is not None:  # released by the walk after both had ended
        assert rows[lost].latency_ms > 0  # its own time (the race timed no cancel)
    used = budgets.usage([Budget.objects.get(name="cap")])["cap"]
    if driver == "async" or rows[lost].usage is not None:
        # On the event loop both sides end in the same turn and the walk releases the
        # loser; on the sync driver a loser that saw the race lost closes its stream
        # itself, after the walk has recorded it (docs/strategies.md, "Hedging").
        assert rows[lost].usage == Usage(input_tokens=2, output_tokens=2)
        assert used.tokens == 8  # the winner's 4 and the loser's 4
    else:
        assert used.tokens == 4
