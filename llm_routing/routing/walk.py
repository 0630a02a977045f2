"""The walk of one routed request (:class:`_Session`): availability, the retry layer,
failover, and the request's one exit (:meth:`_Session.finish`) with its ``Record`` and
``Announce`` effects; :func:`route` and :func:`aroute` drive it.

Its methods are generators of effects (:mod:`llm_routing.effects`): the same walk runs
under the sync and the async drivers.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from .. import balance, budgets, effects, recorder, strategies
from ..availability import may_try, missing_capability, target_dimension
from ..balance import CountInFlight, Lease, Recall, Remember, Unlease
from ..conf import routing_settings
from ..effects import (
    AsyncSleeper,
    ClientGone,
    Context,
    Effect,
    Race,
    Sleeper,
    Steps,
)
from ..errors import ClientDisconnectedError, ResponseError
from ..models import Provider
from ..providers.base import BaseProvider
from ..providers.embeddings import checked_answer
from ..resilience import breaker
from ..resilience.breaker import Observe
from ..resilience.budget import MIN_ATTEMPT_S, Budget
from ..resilience.retry import InvokeSteps, error_result, retry_steps
from ..sanitize import sanitized
from ..signals import (
    after_provider_result,
    asend,
    before_provider_call,
    on_provider_fallback,
    request_routed,
    send,
)
from ..strategies import Candidate, Pick
from ..types import (
    MOCK_PROVIDER_NAME,
    AttemptRecord,
    AuditRequest,
    ErrorInfo,
    ProviderResult,
    RoutingMetadata,
    RoutingResult,
    Usage,
)
from .plan import PlanStep, Setup, _adapter_for, _Setup, affinity_key, with_output_ceiling

#: The logger operators configure for the router (docs/providers.md).
logger = logging.getLogger("llm_routing.router")

T = TypeVar("T")


@dataclass
class _Walk:
    request_id: str
    attempts: list[AttemptRecord] = field(default_factory=list)

    def add(self, **kwargs: object) -> AttemptRecord:
        attempt = AttemptRecord(index=len(self.attempts), **kwargs)  # type: ignore[arg-type]
        self.attempts.append(attempt)
        return attempt


@dataclass(frozen=True, slots=True)
class _Tried:
    """A candidate the walk called (or hedged with) and what it needs to settle it."""

    step: int
    candidate: Candidate
    row: Provider | None
    strategy: str
    lease: tuple[str, str] | None
    lost_ms: float | None = None  # a hedge's loser: how long it ran before its cancel
    skipped: str | None = None  # a hedge not started: why (deadline, attempt_budget, cost_cap)
    usage: Usage | None = None  # a loser's usage, when it had its whole answer (atomic)

    def unused(self) -> dict[str, object]:
        """The attempt row of a hedge's loser or of a hedge skipped."""
        model = self.candidate.model or (self.row.model if self.row else "")
        if self.skipped is not None:
            return {"provider": self.candidate.name, "model": model,
                    "outcome": "hedge_skipped", "reason": self.skipped}  # fmt: skip
        return {"provider": self.candidate.name, "model": model, "outcome": "hedge_lost",
                "reason": "hedge_lost", "latency_ms": self.lost_ms or 0.0,
                "usage": self.usage}  # fmt: skip


class _Hold:
    """What one side of a hedge race leaves open past its answer (a stream opened up to
    its first token): kept when the side wins, released when it loses — by the walk
    (:meth:`lose`), or by the side itself when it opens only after the race was decided
    (a sync side cannot be interrupted). The lock orders the side's :meth:`keep` and
    the walk's :meth:`lose`, so exactly one of them releases it. ``usage``: what the
    side the walk released had reported (an atomic stream buffered to its end), the
    usage of its ``hedge_lost`` row, so charged to the request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lost = False
        self._release: Callable[[], Steps[Usage | None]] | None = None
        self.usage: Usage | None = None

    def keep(self, publish: Callable[[], None], release: Callable[[], Steps[Usage | None]]) -> bool:
        """The side has opened something: ``publish`` it to the walk and remember how to
        ``release`` it (which answers the usage the side had seen); False (nothing
        published) once the side has lost."""
        with self._lock:
            if self._lost:
                return False
            publish()
            self._release = release
            return True

    def lose(self) -> Steps[bool]:
        """The side lost: release what it kept (whether it had kept anything); what it
        opens from now on, it releases itself."""
        with self._lock:
            self._lost = True
            release, self._release = self._release, None
        if release is None:
            return False
        self.usage = yield from release()
        return True


@dataclass
class _HedgeSide:
    """What the hedge's side of a race found (written by its core, read after it)."""

    candidate: tuple[int, Candidate] | None = None  # the first it considered
    skipped: str | None = None  # why no second call could be afforded
    tried: _Tried | None = None  # the candidate it called
    primary: Candidate | None = None  # the first attempt's candidate (for a cost cap)
    hold: _Hold = field(default_factory=_Hold)  # what its call left open

    def entry(self, *, skipped: str) -> _Tried:
        assert self.candidate is not None
        index, candidate = self.candidate
        return _Tried(index, candidate, None, "", None, skipped=skipped)


class _Ahead:
    """The candidates the walk has ordered and not yet tried (a step is ordered when the
    walk reaches it, or when a hedge looks for the next candidate), and those already
    tried as a hedge."""

    def __init__(self, steps: tuple[PlanStep, ...]) -> None:
        self.steps = steps
        self.queue: list[tuple[int, Candidate]] = []
        self.ordered = 0
        self.tried: set[tuple[str, str]] = set()

    def fill(self, session: _Session) -> Steps[bool]:
        """Order the next step into the queue; False when every step is ordered."""
        if self.ordered >= len(self.steps):
            return False
        index = self.ordered
        self.ordered += 1
        members = yield from session._step_order(index, self.steps[index])
        self.queue.extend((index, c) for c in members)
        return True


def _attempt_record(result: ProviderResult, *, served: bool) -> dict[str, object]:
    err = result.error
    return {
        "provider": result.provider,
        "model": result.model,
        "outcome": "ok" if result.ok else "error",
        "reason": err.category if err else None,
        "error_category": err.category if err else None,
        "http_status": err.http_status if err else None,
        "transient": err.transient if err else False,
        "retries": result.retries,
        "latency_ms": result.latency_ms,
        "served": served,
        "usage": result.usage,
    }


def _skip_result(
    name: str, model: str, reason: str, *, capability: str | None = None
) -> ProviderResult:
    """The adapter state of a provider that could not run (forced mode only)."""
    if reason in {"disabled", "missing_key"}:
        mode, status = "disabled", "fallback"
        message = (
            "The provider is disabled."
            if reason == "disabled"
            else "The provider's key variable is not set."
        )
    else:
        mode, status = "error", "error"
        message = {
            "unknown_provider": "No provider has that name.",
            "unsupported": f"The provider does not support {capability or 'a capability'}, "
            "which this request needs.",
            "circuit_open": "The provider's circuit is open.",
            "not_allowed": "You may not route to this provider.",
            "budget_exhausted": "The request-wide deadline or attempt budget is used up.",
            "dimension_mismatch": "The provider's declared embedding dimension is not "
            "the one this request needs.",
        }.get(reason, reason)
    return ProviderResult(
        provider=name,
        model=model,
        mode=mode,  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        error=ErrorInfo(category=reason, message=message),
    )


class AttemptFn(Protocol):
    """One candidate's attempt: :meth:`_Session.call`, or a stream's opener (which
    leaves the stream open at its first token). ``hedged``: a side of a hedge race, and
    its :class:`_Hold` on what the attempt leaves open."""

    def __call__(
        self, adapter: BaseProvider, *, hedged: _Hold | None = None
    ) -> Steps[ProviderResult]: ...


def order_step(
    index: int,
    step: PlanStep,
    *,
    request: AuditRequest,
    rows: dict[str, Provider],
    denied: frozenset[str],
    seed: str,
    affinity: str | None = None,
) -> Steps[tuple[tuple[Candidate, ...], Pick | None]]:
    """A step's members in the order the walk tries them, and why (the walk and
    explain): a step of one as it is; a step of several in its strategy's order
    (:func:`strategies.order`, with what :mod:`llm_routing.balance` gathered), the
    candidates the caller may not use last and out of the draw. With an ``affinity``
    cache key (:func:`balance.affinity_cache_key`), the candidate that served it last
    goes first (the pick's reason: ``affinity``) unless it is drained or denied."""
    members = step.members
    usable = [c for c in members if c.name not in denied]
    if len(members) < 2 or not step.strategy or not usable:
        return members, None
    counts: dict[str, int] | None = None
    if step.strategy == "least_in_flight":
        counts = yield from CountInFlight(tuple(c.name for c in usable))
    inputs = balance.gather(step.strategy, usable, request, rows, counts)
    ordered, pick = strategies.order(step.strategy, usable, step=index, seed=seed, inputs=inputs)
    if affinity is not None:
        last = yield from Recall(affinity)
        kept = next((c for c in ordered if c.name == last and not c.drained), None)
        if kept is not None:
            ordered = (kept, *(c for c in ordered if c is not kept))
            order = tuple(c.name for c in ordered)
            pick = replace(pick, picked=kept.name, reason="affinity", order=order)
    return (*ordered, *(c for c in members if c.name in denied)), pick


def _off_loop(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """How the async drivers run their blocking database calls (``_setup``, ``Record``):
    in a worker thread, never on the event loop. (tests/drivers.py runs them in the
    test's thread instead, where its transaction lives.) The worker's database
    connection is then handled as at the end of a request (``CONN_MAX_AGE``), so
    worker threads do not pile up open connections."""

    def in_worker(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(in_worker, thread_sensitive=False)


@dataclass(frozen=True, slots=True)
class Record(Effect[None]):
    """Record the decision and its attempts → None (never raises; spools on a DB error)."""

    request: AuditRequest
    routed: RoutingResult

    def run(self, ctx: Context) -> None:
        if ctx.finalizing:  # a dropped stream's finalizer: never the database here
            recorder.submit(self.request, self.routed)
        else:
            recorder.record_or_spool(self.request, self.routed)

    async def arun(self, ctx: Context) -> None:
        if routing_settings.RECORD_MODE == "write_behind" or ctx.finalizing:
            recorder.submit(self.request, self.routed)  # a bounded queue: never blocks
        else:
            await _off_loop(recorder.record_or_spool)(self.request, self.routed)


@dataclass(frozen=True, slots=True)
class Announce(Effect[None]):
    """Send ``request_routed`` → None: the budgets' settlement with the usage the
    upstream reported and the release of the place in flight, metrics, traces. On the
    event loop it awaits what its receivers deferred (the settlement task), so a loop
    that stops right after the request cannot lose the charge."""

    request: AuditRequest
    routed: RoutingResult

    def run(self, ctx: Context) -> None:
        send(request_routed, request_id=self.routed.request_id, request=self.request,
             routed=self.routed)  # fmt: skip

    async def arun(self, ctx: Context) -> None:
        await asend(request_routed, request_id=self.routed.request_id, request=self.request,
                    routed=self.routed)  # fmt: skip


def _target(request: AuditRequest, setup: _Setup) -> int | None:
    """The embeddings request's vector length (:func:`target_dimension`)."""
    rows = setup.rows
    candidates = (
        (name, rows.get(name), _adapter_for(name, model, rows.get(name)))
        for name, model in setup.plan.candidates
    )
    return target_dimension(request, candidates, setup.denied)


def _gone_error() -> ClientDisconnectedError:
    return ClientDisconnectedError()


class _Session:
    """One routed request: its plan, walk, budget; shared by every driver. Its methods
    are generators of effects (:mod:`llm_routing.effects`)."""

    def __init__(
        self,
        request: AuditRequest,
        setup: _Setup,
        *,
        request_id: str | None,
        started: float,
    ) -> None:
        self.started = started
        self.request = request
        self.walk = _Walk(request_id=request_id or str(uuid.uuid4()))
        self.plan = setup.plan
        self.rows = setup.rows
        self.budget = Budget(
            deadline_s=float(routing_settings.REQUEST_DEADLINE_S),
            max_attempts=int(routing_settings.MAX_ATTEMPTS),
        )
        # Candidates the caller may not use: skipped as not_allowed (docs/operations.md).
        self.denied = setup.denied
        if request.call == "embed":  # every candidate is held to one vector length
            self.request = replace(request, expected_dimensions=_target(request, setup))
        # Set by the one exit (:meth:`finish`), which runs once.
        self.routed: RoutingResult | None = None
        # Steps: how each strategy ordered its step, the places in flight held (given
        # back by finish()), the largest context window that failed for length.
        self.picks: list[Pick] = []
        self.leases: list[tuple[str, str]] = []
        self.context_floor: int | None = None
        # Prompt-cache affinity: the request's key (docs/strategies.md).
        self.affinity = affinity_key(request, setup.plan)
        # Hedging: won, lost, failed (both ended without an answer) or skipped.
        self.hedge_outcome: str | None = None

    @property
    def request_id(self) -> str:
        return self.walk.request_id

    def skip(
        self,
        name: str,
        row: Provider | None,
        adapter: BaseProvider | None,
        budget: Budget | None,
        *,
        forced: bool = False,
        needs: frozenset[str] = frozenset(),
        drained: bool = False,
        context_floor: int | None = None,
    ) -> Steps[str | None]:
        """:func:`~llm_routing.availability.may_try` for this request (its caller's
        access rules), claiming the circuit (a half-open probe slot)."""
        return (
            yield from may_try(
                name,
                row,
                adapter,
                self.request,
                denied=self.denied,
                budget=budget,
                forced=forced,
                needs=needs,
                drained=drained,
                context_floor=context_floor,
            )
        )

    def call(
        self,
        adapter: BaseProvider,
        request: AuditRequest | None = None,
        invoke: InvokeSteps | None = None,
        *,
        defer_success: bool = False,
        hedged: _Hold | None = None,
    ) -> Steps[ProviderResult]:
        """One candidate through the retry layer, with hooks and breaker bookkeeping.

        ``defer_success``: an opened stream is not a success yet — the caller feeds the
        breaker once the stream has ended (:func:`_settle`). ``hedged``: a side of a
        :class:`~llm_routing.effects.Race` — cancelled, it records nothing (the walk
        records the loser as ``hedge_lost``); a call leaves nothing open to hold."""
        request = with_output_ceiling(request or self.request, adapter.config)
        config = adapter.config
        send(
            before_provider_call,
            request_id=self.request_id,
            provider=config.name,
            model=config.model,
            task=request.task,
        )
        # A half-open probe is exactly one upstream request.
        max_retries = 0 if breaker.is_probe(config) else None
        try:
            result = yield from retry_steps(
                adapter, request, budget=self.budget, invoke=invoke, max_retries=max_retries
            )
        except ClientGone:
            # Cut short by the client (async drivers): never counted, frees a probe slot.
            gone = error_result(
                adapter, _gone_error(), latency_ms=0.0, retries=0, upstream_requests=1
            )
            yield from Observe(config, gone)
            if hedged is None:
                self.walk.add(**_attempt_record(gone, served=False))
            raise
        result = checked_answer(sanitized(result, request), request, config)
        if not (defer_success and result.ok):
            try:
                yield from Observe(config, result)
            except ClientGone:  # cancelled here: the answer (and its usage) still counts
                if hedged is None:
                    self.walk.add(**_attempt_record(result, served=False))
                raise
        send(after_provider_result, request_id=self.request_id, provider=config.name, result=result)
        return result

    def gone(self) -> ProviderResult:
        """The final result of a request whose client went away before its answer."""
        last = self.walk.attempts[-1] if self.walk.attempts else None
        return ProviderResult(
            provider=last.provider if last else "",
            model=last.model if last else "",
            mode="error",
            status="error",
            error=_gone_error().to_info(),
        )

    def run(self, attempt: AttemptFn) -> Steps[tuple[ProviderResult, str | None]]:
        if self.plan.router_mode == "forced":
            return (yield from self._forced(attempt))
        return (yield from self._walk_chain(attempt))

    def _forced(self, attempt: AttemptFn) -> Steps[tuple[ProviderResult, str | None]]:
        """Exactly the forced provider: no skipping, no mock substitution."""
        request = self.request
        name = self.plan.names[0]
        row = self.rows.get(name)
        adapter = _adapter_for(name, "", row)
        # Forced mode never substitutes the mock, but it respects the access rules, the
        # attempt budget and the circuit: an open circuit answers circuit_open without
        # a call; a half-open one lets the forced call be its single probe.
        reason = yield from self.skip(name, row, adapter, self.budget, forced=True)
        if reason is not None or adapter is None:
            reason = reason or "unknown_provider"
            model = row.model if row else ""
            self.walk.add(provider=name, model=model, outcome="skipped", reason=reason)
            capability = missing_capability(adapter, request) if adapter is not None else None
            return _skip_result(name, model, reason, capability=capability), None
        result = yield from attempt(adapter)
        self.walk.add(**_attempt_record(result, served=result.ok))
        return result, None

    def _affinity(self, index: int) -> str | None:
        """This request's affinity cache key in step ``index`` (None: no key)."""
        if self.affinity is None:
            return None
        return balance.affinity_cache_key(self.plan.chain_name or "", index, self.affinity)

    def _order(self, index: int, step: PlanStep) -> Steps[tuple[Candidate, ...]]:
        ordered, pick = yield from order_step(
            index, step, request=self.request, rows=self.rows, denied=self.denied,
            seed=self.request_id, affinity=self._affinity(index),
        )  # fmt: skip
        if pick is not None:
            self.picks.append(pick)
        return ordered

    def _hedge_after(self, adapter: BaseProvider) -> float | None:
        """Seconds after which this attempt is hedged (None: no hedge): the chain's
        ``hedge_after_ms``, or the p95 of the candidate's recent latency in this process
        (none yet: no hedge); never for the mock or a half-open probe. A stream's attempt
        ends at its first token (``atomic``: its whole answer)."""
        setting = self.plan.hedge_after_ms
        if not setting:
            return None
        config = adapter.config
        if config.name == MOCK_PROVIDER_NAME or breaker.is_probe(config):
            return None
        if setting == "p95":
            p95 = balance.p95(config.name)
            return None if p95 is None else p95 / 1000
        return int(setting) / 1000

    def _hedged(
        self,
        attempt: AttemptFn,
        adapter: BaseProvider,
        after_s: float,
        ahead: _Ahead,
        tried: list[_Tried],
    ) -> Steps[list[ProviderResult | None]]:
        """One attempt with a hedge (:class:`~llm_routing.effects.Race`): the results
        per entry of ``tried``, which gains the hedge's entry when it was due; None for
        a loser or a skipped hedge (their ``unused()`` rows). A loser that had left
        something open (a stream at its first token) is released here and lost."""
        waiting = [
            (i, c) for i, c in ahead.queue
            if c.name != MOCK_PROVIDER_NAME and (c.name, c.model) not in ahead.tried
        ]  # fmt: skip
        if not waiting:  # nobody left to hedge with
            return [(yield from attempt(adapter))]
        hedge, hold = _HedgeSide(primary=tried[0].candidate), _Hold()
        try:
            raced = yield from Race(
                attempt(adapter, hedged=hold), self._hedge(attempt, waiting, hedge, after_s),
                after_s,
            )  # fmt: skip
        except ClientGone:  # cancelled (async driver): both sides have unwound
            gone = error_result(
                adapter, _gone_error(), latency_ms=0.0, retries=0, upstream_requests=1
            )
            self.walk.add(**_attempt_record(gone, served=False), step=tried[0].step)
            raise
        results = list(raced.results)
        lost_usage: Usage | None = None
        lost_ms = raced.lost_ms
        if raced.winner is not None:
            losing = (hold, hedge.hold)[1 - raced.winner]
            ended = results[1 - raced.winner]
            if (yield from losing.lose()):
                results[1 - raced.winner] = None  # it had opened too: cancelled now
                lost_usage = losing.usage
                if isinstance(ended, ProviderResult):  # both had ended: its own time
                    lost_ms = ended.latency_ms
        for outcome in results:
            if isinstance(outcome, Exception):
                raise outcome  # a hook or a bug: the walk's own failure path
        primary, second = results
        assert not isinstance(primary, Exception) and not isinstance(second, Exception)
        if not raced.hedged:
            return [primary]
        if hedge.skipped is not None:
            self.hedge_outcome = "skipped"
            tried.append(hedge.entry(skipped=hedge.skipped))
            return [primary, None]
        if hedge.tried is None:  # no candidate was available to hedge with
            return [primary]
        ahead.tried.add((hedge.tried.candidate.name, hedge.tried.candidate.model))
        tried.append(hedge.tried)
        if raced.winner == 1:
            self.hedge_outcome = "won"
        elif raced.winner == 0:
            self.hedge_outcome = "lost"
        else:
            self.hedge_outcome = "failed"
        if primary is None:  # the hedge won: the primary is the loser
            tried[0] = replace(tried[0], lost_ms=lost_ms, usage=lost_usage)
        elif second is None:
            tried[1] = replace(tried[1], lost_ms=lost_ms, usage=lost_usage)
        return [primary, second]

    def _hedge(
        self,
        attempt: AttemptFn,
        waiting: list[tuple[int, Candidate]],
        side: _HedgeSide,
        after_s: float,
    ) -> Steps[ProviderResult]:
        """The hedge's side of a :class:`~llm_routing.effects.Race`, run when it is due:
        whether the request can afford a second call (an attempt left in the budget, at
        least ``after_s`` — as long as the primary has had — before the deadline, and
        room in its tokens and cost caps: :meth:`_over_cap`), then the first of
        ``waiting`` that :func:`may_try` lets through."""
        budget = self.budget
        first_index, first = waiting[0]
        side.candidate = (first_index, first)
        if budget.attempts_used >= budget.max_attempts:
            side.skipped = "attempt_budget"
        elif budget.remaining() < max(MIN_ATTEMPT_S, after_s):
            side.skipped = "deadline"  # less time left than the primary has had
        elif self._over_cap(side.primary, first):
            side.skipped = "cost_cap"
        if side.skipped is not None:
            return _skip_result(first.name, first.model, "hedge_skipped")
        for index, candidate in waiting:
            row = self.rows.get(candidate.name)
            adapter = _adapter_for(candidate.name, candidate.model, row)
            strategy = self.plan.step_list()[index].applied
            reason = yield from self.skip(
                candidate.name, row, adapter, budget,
                drained=bool(strategy) and candidate.drained, context_floor=self.context_floor,
            )  # fmt: skip
            if reason is None and adapter is not None:
                # Settled as its step's member: a latency sample, the affinity key, and
                # in a least_in_flight step a place in flight as the walk's own call has.
                lease = yield from self._take_place(strategy, candidate.name)
                side.tried = _Tried(index, candidate, row, strategy, lease)
                return (yield from attempt(adapter, hedged=side.hold))
        return _skip_result(first.name, first.model, "unavailable")

    def _over_cap(self, primary: Candidate | None, hedge: Candidate) -> bool:
        """Whether the tokens or cost caps this request was admitted under cannot hold a
        hedge on ``hedge``: the room admission saw (:func:`budgets.room`, from memory;
        None without such a cap) against this request's estimate on the primary plus
        its estimate on the hedge (:func:`balance.estimate_tokens`, and the ``cost``
        strategy's :func:`balance.estimate_usd`; an unknown price counts 0, as budgets
        charge it)."""
        room = budgets.room()
        if room is None:
            return False
        tokens = nano = 0
        for candidate in (primary, hedge):
            if candidate is None:
                continue
            row = self.rows.get(candidate.name)
            tokens += balance.estimate_tokens(row, self.request)
            if room.nano_usd is not None:
                usd = balance.estimate_usd(row, candidate.model, self.request)
                nano += math.ceil(usd * budgets.NANO) if usd else 0
        return not room.holds(tokens, nano)

    def _take_place(self, strategy: str, name: str) -> Steps[tuple[str, str] | None]:
        """A place in flight at ``name`` for a call of a ``least_in_flight`` step (None
        for any other strategy): held until :meth:`_free_place` or the request's end."""
        if strategy != "least_in_flight":
            return None
        lease = (name, (yield from Lease(name)))
        self.leases.append(lease)
        return lease

    def _free_place(self, lease: tuple[str, str] | None) -> Steps[None]:
        """Give a place in flight back at once (None: none was taken)."""
        if lease is not None:
            self.leases.remove(lease)
            yield from Unlease(*lease)

    def _settle_attempt(self, done: _Tried, result: ProviderResult) -> Steps[bool]:
        """Record one ended attempt (and what the strategies learn from it); whether it
        served the request."""
        name, index, row, lease = done.candidate.name, done.step, done.row, done.lease
        if done.strategy == "latency":
            balance.observe_latency(name, result.latency_ms, ok=result.ok)
        if result.ok:
            balance.observe_answer(name, result.latency_ms)
            if not self.request.stream:  # the call is over (a stream's ends with it)
                yield from self._free_place(lease)
            self.walk.add(**_attempt_record(result, served=True), step=index)
            if done.strategy and (key := self._affinity(index)) is not None:
                ttl = float(row.affinity_ttl_s) if row is not None else 300.0
                yield from Remember(key, name, ttl)  # the key moves with the answer
            return True
        yield from self._free_place(lease)
        self.walk.add(**_attempt_record(result, served=False), step=index)
        category = result.error.category if result.error else "response"
        if category == "context_length" and row is not None:
            window = row.context_window
            if window is not None and (self.context_floor or 0) < window:
                self.context_floor = window
        return False

    def _step_order(self, index: int, step: PlanStep) -> Steps[tuple[Candidate, ...]]:
        """Step ``index``'s members in the order the walk tries them."""
        if step.applied:
            return (yield from self._order(index, step))
        return step.members

    def _walk_chain(self, attempt: AttemptFn) -> Steps[tuple[ProviderResult, str | None]]:
        plan, walk = self.plan, self.walk
        first_reason: str | None = None
        any_attempted = False
        steps = plan.step_list()
        ahead = _Ahead(steps)
        while True:
            if not ahead.queue:
                if not (yield from ahead.fill(self)):
                    break
                continue
            index, candidate = ahead.queue.pop(0)
            step = steps[index]
            strategy = step.applied
            last_step = index == len(steps) - 1
            name, model = candidate.name, candidate.model
            if (name, model) in ahead.tried:  # already tried as a hedge
                continue
            row = self.rows.get(name)
            adapter = _adapter_for(name, model, row)
            reason = yield from self.skip(
                name,
                row,
                adapter,
                self.budget,
                drained=bool(strategy) and candidate.drained,
                context_floor=self.context_floor,
            )
            if reason is not None or adapter is None:
                reason = reason or "unknown_provider"
                shown_model = model or (row.model if row else "")
                walk.add(
                    provider=name, model=shown_model, outcome="skipped", reason=reason,
                    step=index,
                )  # fmt: skip
                first_reason = first_reason or reason
                send(
                    on_provider_fallback, request_id=walk.request_id, provider=name,
                    reason=reason,
                )  # fmt: skip
                continue
            first = not walk.attempts
            is_backstop = name == MOCK_PROVIDER_NAME and last_step
            lease = yield from self._take_place(strategy, name)  # until the call (stream) ends
            tried = [_Tried(index, candidate, row, strategy, lease)]
            after_s = None if is_backstop else self._hedge_after(adapter)
            if after_s is None:
                results: list[ProviderResult | None] = [(yield from attempt(adapter))]
            else:
                if not ahead.queue:  # the next candidate is in the next step
                    yield from ahead.fill(self)
                results = yield from self._hedged(attempt, adapter, after_s, ahead, tried)
            for i, (done, result) in enumerate(zip(tried, results, strict=True)):
                if result is None:  # a hedge's loser, or a hedge skipped
                    if done.strategy == "latency" and done.lost_ms is not None:
                        # It took at least this long: a lower bound its estimate learns.
                        balance.observe_latency(done.candidate.name, done.lost_ms, ok=True)
                    yield from self._free_place(done.lease)  # cancelled: free at once
                    walk.add(**done.unused(), step=done.step)
                    continue
                served = yield from self._settle_attempt(done, result)
                if not served:
                    any_attempted = True
                    category = result.error.category if result.error else "response"
                    first_reason = first_reason or category
                    if result.error is None or result.error.advances:
                        send(
                            on_provider_fallback, request_id=walk.request_id,
                            provider=done.candidate.name, reason=category,
                        )  # fmt: skip
                        continue
                for later, rest in zip(tried[i + 1 :], results[i + 1 :], strict=True):
                    if rest is None:  # the hedge lost, or was skipped
                        walk.add(**later.unused(), step=later.step)
                    else:  # a hedge that ended beside an error that stands
                        walk.add(**_attempt_record(rest, served=False), step=later.step)
                if not served:
                    return result, first_reason if not (first and i == 0) else None
                if first and first_reason is None and plan.configured:
                    return result, None  # (a hedge that won is no fallback)
                if is_backstop and any_attempted:
                    return result, "chain_exhausted"
                return result, first_reason or ("no_chain" if not plan.configured else None)
        # Every candidate was skipped or failed: reachable when the plan has no mock
        # backstop (``backstop=False``, e.g. /v1) or the backstop itself failed.
        last = walk.attempts[-1] if walk.attempts else None
        if plan.backstop:
            error = ResponseError("Every candidate failed, the mock backstop included.").to_info()
        else:
            error = ErrorInfo(
                category="chain_exhausted",
                message="Every candidate was skipped or failed, and this chain has no mock "
                "backstop.",
                transient=True,
            )
        return (
            ProviderResult(
                provider=last.provider if last else "",
                model=last.model if last else "",
                mode="error",
                status="error",
                error=error,
            ),
            "chain_exhausted",
        )

    def failed(self, exc: BaseException) -> ProviderResult:
        """The final result of a walk that raised where nothing should (a bug, a hook):
        an error result, so the request still ends through :meth:`finish`."""
        logger.error(
            "Routing request %s failed unexpectedly (%s); recorded as an error.",
            self.request_id,
            type(exc).__name__,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        last = self.walk.attempts[-1] if self.walk.attempts else None
        return ProviderResult(
            provider=last.provider if last else "",
            model=last.model if last else "",
            mode="error",
            status="error",
            error=ResponseError(
                f"The router failed unexpectedly ({type(exc).__name__})."
            ).to_info(),
        )

    def finish(
        self, final: ProviderResult, fallback_reason: str | None, *, persist: bool
    ) -> Steps[RoutingResult]:
        """The one exit of every request that reached the walk (both drivers, stream or
        not): record the decision (``Record``: inline, spooled, or queued for the
        write-behind writer), then announce it (``request_routed``: the budget's
        settlement with the usage the upstream reported and the release of the place in
        flight, metrics, traces). Exactly once: a second call returns the first's
        result. Nothing raised before or inside it stops it: a recording failure (the
        recorder, an encoding error) is logged and the request is still announced (so
        still charged); a receiver that raises is logged (:func:`signals.send`); a
        client gone or a cancellation during the record still announces it."""
        if self.routed is not None:
            return self.routed
        plan = self.plan
        try:
            final = sanitized(final, self.request)
        except Exception as exc:  # never lose the exit to the filter: a bare error then
            final = self.failed(exc)
        metadata = RoutingMetadata(
            request_id=self.request_id,
            router_mode=plan.router_mode,
            route=self.request.route,
            rule=plan.rule,
            chain_name=plan.chain_name,
            requested_provider=plan.requested_provider,
            selected_provider=final.provider,
            chain=plan.names,
            attempts=tuple(self.walk.attempts),
            fallback_used=fallback_reason is not None,
            fallback_reason=fallback_reason,
            picks=tuple(p.to_dict() for p in self.picks) if self.picks else (),
            hedge=self.hedge_outcome,
        )
        routed = self.routed = RoutingResult(
            request_id=self.request_id,
            result=final,
            metadata=metadata,
            total_latency_ms=(time.perf_counter() - self.started) * 1000,
        )
        announce = Announce(self.request, routed)
        while self.leases:  # the places in flight this request held (quiet effects)
            yield from Unlease(*self.leases.pop())
        try:
            if persist:
                try:
                    yield from Record(self.request, routed)
                except Exception as exc:  # then the write-behind queue (or its spool)
                    logger.error(
                        "Could not record routing decision %s inline (%s); queued.",
                        self.request_id,
                        type(exc).__name__,
                    )
                    recorder.submit(self.request, routed)  # never raises
        except BaseException:  # torn down at the record (ClientGone): queue, announce
            if persist:
                recorder.submit(self.request, routed)  # idempotent: request_id is unique
            announce.run(Context())
            raise
        logger.info(
            "routed request_id=%s task=%s mode=%s selected=%s status=%s fallback=%s",
            self.request_id,
            self.request.task,
            plan.router_mode,
            final.provider,
            final.status,
            fallback_reason,
        )
        try:
            yield from announce
        except Exception:  # the effect failed: send it here, synchronously
            announce.run(Context())
        except BaseException:  # torn down at the announcement: send it here
            announce.run(Context())
            raise
        return routed


def _route(request: AuditRequest, request_id: str | None, persist: bool) -> Steps[RoutingResult]:
    """The whole of :func:`route` / :func:`aroute`."""
    started = time.perf_counter()
    session = _Session(request, (yield from Setup(request)), request_id=request_id, started=started)
    try:
        final, fallback_reason = yield from session.run(session.call)
    except ClientGone:  # cancelled (async driver): the decision is still recorded
        yield from session.finish(session.gone(), None, persist=persist)
        raise
    except Exception as exc:  # a bug or a hook: still one exit, and no 500
        final, fallback_reason = session.failed(exc), None
    return (yield from session.finish(final, fallback_reason, persist=persist))


def route(
    request: AuditRequest,
    *,
    request_id: str | None = None,
    sleeper: Sleeper | None = None,
    persist: bool = True,
) -> RoutingResult:
    """Route one request and record it. Never raises on a well-formed request."""
    return effects.run(_route(request, request_id, persist), sleeper=sleeper)


async def aroute(
    request: AuditRequest,
    *,
    request_id: str | None = None,
    sleeper: AsyncSleeper | None = None,
    persist: bool = True,
) -> RoutingResult:
    """:func:`route` for the event loop (the same walk, driven with awaits);
    ``sleeper`` is an async callable. Cancelled, it still records the decision."""
    return await effects.arun(_route(request, request_id, persist), sleeper=sleeper)
