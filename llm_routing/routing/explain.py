"""What the router would do with a request now (:func:`explain`), without calling a
provider, recording anything or claiming a probe slot: the plan of
:mod:`llm_routing.routing.plan` and the walk's own availability decision."""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace

from .. import balance, effects
from ..availability import may_try, missing_capability, target_dimension
from ..balance import Recall
from ..conf import routing_settings
from ..effects import Steps
from ..explanation import (
    AffinityExplanation,
    CandidateExplanation,
    Explanation,
    HedgeExplanation,
)
from ..resilience import breaker
from ..resilience.budget import MIN_ATTEMPT_S
from ..snapshot import current
from ..strategies import Candidate, Pick
from ..types import (
    MOCK_PROVIDER_NAME,
    AuditRequest,
)
from .plan import Plan, _adapter_for, _denied, affinity_key, resolve
from .walk import order_step

#: The logger operators configure for the router (docs/providers.md).
logger = logging.getLogger("llm_routing.router")


def explain(request: AuditRequest, *, request_id: str | None = None) -> Explanation:
    """What :func:`route` would do with ``request`` now, without calling any provider,
    recording anything or touching circuit state (no half-open probe slot is claimed).

    The same :func:`resolve` and :func:`~llm_routing.availability.may_try` as the walk;
    the circuit is read (``PeekCircuit``) instead of claimed (``Allow``). What it
    cannot foresee: a provider failing, and the budget running out after earlier
    attempts (every verdict assumes a fresh budget).

    A step of several candidates is ordered as the walk would order it
    (:func:`~llm_routing.routing.walk.order_step`) for ``request_id`` (a fresh one when
    None; the id of a recorded request replays its weighted draw), and its pick is in
    ``picks``. With an affinity key (``request.affinity``, or the OpenAI ``user`` when
    the chain says ``affinity_from_user``) each such step reads — never writes — the
    candidate that served the key last, as the walk does (``affinity``). ``hedge``
    says when the first attempt would be hedged and with whom (:func:`_hedge`).
    """
    snap = current()
    plan = resolve(request, snap)
    rows = snap.rows(plan.names)
    forced = plan.router_mode == "forced"
    denied = _denied(plan, request, snap)
    if request.call == "embed":  # the walk's target vector length (dimension_mismatch)
        candidates = ((n, rows.get(n), _adapter_for(n, m, rows.get(n))) for n, m in plan.candidates)
        request = replace(
            request, expected_dimensions=target_dimension(request, candidates, denied)
        )
    seed = request_id or str(uuid.uuid4())
    out: list[CandidateExplanation] = []
    picks: list[Pick] = []
    walk_order: list[tuple[int, Candidate, bool]] = []  # (step, candidate, drainable)
    key = None if forced else affinity_key(request, plan)
    remembered: dict[int, str | None] = {}  # per step of several, with a key
    for index, step in enumerate(plan.step_list()):
        cache_key = (
            None if key is None else balance.affinity_cache_key(plan.chain_name or "", index, key)
        )
        ordered, pick = effects.run(
            order_step(
                index, step, request=request, rows=rows, denied=denied, seed=seed,
                affinity=cache_key,
            )
        )  # fmt: skip
        if pick is not None:
            picks.append(pick)
            if cache_key is not None:  # who served the key last (read, never written)
                remembered[index] = (
                    pick.picked if pick.reason == "affinity" else effects.run(_recall(cache_key))
                )
        walk_order.extend(
            (index, c, len(step.members) > 1 and bool(step.strategy)) for c in ordered
        )
    for position, (step_index, candidate, drainable) in enumerate(walk_order):
        name, model = candidate.name, candidate.model
        row = rows.get(name)
        adapter = _adapter_for(name, model, row)
        # The walk's own decision, the circuit read without claiming a probe slot.
        reason = effects.run(
            may_try(
                name, row, adapter, request, denied=denied, forced=forced, claim=False,
                drained=drainable and candidate.drained,
            )
        )  # fmt: skip
        shown_model = model or (adapter.config.model if adapter else (row.model if row else ""))
        if adapter is None:
            out.append(
                CandidateExplanation(
                    position,
                    name,
                    shown_model,
                    "skip",
                    reason or "unknown_provider",
                    step=None if forced else step_index,
                )
            )
            continue
        config = adapter.config
        look = breaker.peek(config)
        circuit = look.circuit
        out.append(
            CandidateExplanation(
                position=position,
                provider=name,
                model=shown_model,
                verdict="skip" if reason else "try",
                reason=reason,
                missing_capability=(
                    missing_capability(adapter, request) if reason == "unsupported" else None
                ),
                circuit=look.phase if look.tracked else "n/a",
                open_until=circuit.open_until if circuit and look.phase != breaker.CLOSED else None,
                probe=look.probe and reason is None,
                timeout_s=float(config.timeout_s),
                first_token_timeout_s=float(config.first_token_timeout_s),
                max_retries=0 if look.probe else int(config.max_retries),
                backstop=name == MOCK_PROVIDER_NAME and position == len(plan.candidates) - 1,
                step=None if forced else step_index,
            )
        )
    affinity = None
    if key is not None:
        affinity = tuple(_affinity(index, last, out) for index, last in sorted(remembered.items()))
    return Explanation(
        plan=plan,
        candidates=tuple(out),
        picks=tuple(p.to_dict() for p in picks),
        deadline_s=float(routing_settings.REQUEST_DEADLINE_S),
        max_attempts=int(routing_settings.MAX_ATTEMPTS),
        affinity=affinity,
        hedge=_hedge(plan, request, tuple(out)),
    )


def _recall(cache_key: str) -> Steps[str | None]:
    return (yield from Recall(cache_key))


def _affinity(
    index: int, last: str | None, candidates: list[CandidateExplanation]
) -> AffinityExplanation:
    """What the key does in step ``index``: the walk goes back to ``last`` (kept), or
    it is unavailable and the key moves to whoever answers (moved), or nothing is
    remembered yet (new)."""
    serves = next((c.provider for c in candidates if c.step == index and c.verdict == "try"), None)
    if last is None:
        outcome = "new"
    else:
        outcome = "kept" if serves == last else "moved"
    return AffinityExplanation(step=index, remembered=last, serves=serves, outcome=outcome)


def _hedge(
    plan: Plan, request: AuditRequest, candidates: tuple[CandidateExplanation, ...]
) -> HedgeExplanation:
    """Whether the walk would hedge its first attempt now (``_Session._hedge_after``,
    ``_hedged``, ``_hedge``), assuming the attempt is slow: the chain's
    ``hedge_after_ms`` resolved now (``p95``: the primary's current p95 in this process),
    and the hedge — the first candidate after the primary that ``may_try`` lets through,
    among the rest of the primary's step, or the next step's when none is left in it;
    never the mock. ``reason`` says why no hedge would start; a cost cap is not
    foreseen (it depends on the caller's budgets at admission)."""
    setting = plan.hedge_after_ms
    shown: int | str | None = None if not setting else ("p95" if setting == "p95" else int(setting))
    primary = next((c for c in candidates if c.verdict == "try"), None)
    name = primary.provider if primary is not None else None
    after_ms: float | None = None
    if isinstance(shown, int):
        after_ms = float(shown)
    elif shown == "p95" and name is not None:
        after_ms = balance.p95(name)
    hedge: str | None = None
    unavailable = False
    if primary is not None:
        rest = [c for c in candidates if c.position > primary.position]
        group = [c for c in rest if c.step == primary.step] or [
            c for c in rest if c.step == (primary.step or 0) + 1
        ]
        group = [c for c in group if c.provider != MOCK_PROVIDER_NAME]
        hedge = next((c.provider for c in group if c.verdict == "try"), None)
        unavailable = bool(group) and hedge is None
    reason: str | None = None
    if plan.router_mode == "forced":
        reason = "forced"
    elif shown is None:
        reason = "not_configured"
    elif primary is None:
        reason = "no_primary"
    elif name == MOCK_PROVIDER_NAME:
        reason = "mock"
    elif primary.probe:
        reason = "probe"
    elif after_ms is None:
        reason = "no_p95_yet"
    elif hedge is None:
        reason = "unavailable" if unavailable else "no_candidate"
    elif int(routing_settings.MAX_ATTEMPTS) < 2:
        reason = "attempt_budget"
    elif float(routing_settings.REQUEST_DEADLINE_S) - after_ms / 1000 < max(
        MIN_ATTEMPT_S, after_ms / 1000
    ):
        reason = "deadline"
    return HedgeExplanation(
        setting=shown, after_ms=after_ms, primary=name, candidate=hedge, reason=reason
    )
