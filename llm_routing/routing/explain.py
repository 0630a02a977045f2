"""What the router would do with a request now (:func:`explain`), without calling a
provider, recording anything or claiming a probe slot: the plan of
:mod:`llm_routing.routing.plan` and the walk's own availability decision."""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace

from .. import effects
from ..availability import may_try, missing_capability, target_dimension
from ..conf import routing_settings
from ..explanation import CandidateExplanation, Explanation
from ..resilience import breaker
from ..snapshot import current
from ..strategies import Candidate, Pick
from ..types import (
    MOCK_PROVIDER_NAME,
    AuditRequest,
)
from .plan import _adapter_for, _denied, resolve
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
    ``picks``.
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
    for index, step in enumerate(plan.step_list()):
        ordered, pick = effects.run(
            order_step(index, step, request=request, rows=rows, denied=denied, seed=seed)
        )
        if pick is not None:
            picks.append(pick)
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
    return Explanation(
        plan=plan,
        candidates=tuple(out),
        picks=tuple(p.to_dict() for p in picks),
        deadline_s=float(routing_settings.REQUEST_DEADLINE_S),
        max_attempts=int(routing_settings.MAX_ATTEMPTS),
    )
