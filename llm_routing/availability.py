"""May this candidate be tried now, and if not, why — the one availability decision.

:func:`may_try` is asked by every place that picks a candidate: the walk, a forced call,
continuation streaming (which also needs ``prefill``) and explain (which reads the
circuit without claiming a probe slot). Its reasons, in the order they are checked:

``not_allowed`` (the caller's access rules; never the mock) · ``unknown_provider`` (no
row, or — forced — no adapter for its kind) · ``disabled`` · ``drained`` (weight 0 in
its step) · ``unknown_provider`` (no adapter for its kind) · ``missing_key`` ·
``unsupported`` (a capability the request needs: :func:`missing_capability`) ·
``context_too_small`` (after a context-length failure, a declared context window not
larger than the failed one's: :func:`too_small`) · ``dimension_mismatch`` (an
embeddings request: the row declares a vector length other than the request's target,
:func:`target_dimension`) · ``budget_exhausted`` (the request-wide deadline or attempt
budget leaves no room for a real call; checked before the circuit so a half-open probe
slot is never taken in vain) · ``circuit_open`` (last: the breaker's ``Allow`` effect,
which may claim the half-open probe slot, or ``PeekCircuit``).

The mock backstop is always available, except for a capability asked beyond the
request's own (``needs``: continuation's ``prefill``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .effects import Steps
from .models import Provider
from .providers.base import BaseProvider
from .resilience.breaker import Allow, PeekCircuit
from .resilience.budget import Budget
from .types import CAPABILITIES, MOCK_PROVIDER_NAME, SKIP_REASONS, AuditRequest

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["SKIP_REASONS", "may_try", "missing_capability", "target_dimension", "too_small"]


def missing_capability(
    adapter: BaseProvider, request: AuditRequest, also: frozenset[str] = frozenset()
) -> str | None:
    """The first capability the request needs (and ``also``) that the provider lacks
    (in :data:`~llm_routing.types.CAPABILITIES` order), or None when it can serve it."""
    needed = request.required_capabilities | also
    for capability in CAPABILITIES:
        if capability in needed and not adapter.supports(capability):
            return capability
    return None


def too_small(row: Provider, context_floor: int | None) -> bool:
    """Whether ``row``'s declared context window cannot hold what already failed with a
    context-length error on a window of ``context_floor`` tokens (None: no such failure,
    or the failed candidate declared no window). An undeclared window is tried."""
    window = row.context_window
    return context_floor is not None and window is not None and window <= context_floor


def target_dimension(
    request: AuditRequest,
    candidates: Iterable[tuple[str, Provider | None, BaseProvider | None]],
    denied: frozenset[str] = frozenset(),
) -> int | None:
    """The vector length every candidate of an embeddings request is held to: the
    ``dimensions`` the client asked for, else the declared ``embedding_dimensions`` of
    the first candidate (in plan order) that is enabled, usable by the caller, serves
    embeddings and declares one; None when none does (then only the answer's own
    consistency is checked). Set once per request by the walk (and explain) as
    ``request.expected_dimensions``; :func:`may_try` skips a candidate declaring
    another length as ``dimension_mismatch``, and an answer of another length is a
    ``response`` error (:func:`llm_routing.providers.embeddings.checked_answer`): two
    vector spaces are never mixed."""
    if request.call != "embed":
        return None
    if request.dimensions is not None:
        return request.dimensions
    for name, row, adapter in candidates:
        if adapter is None or name in denied or (row is not None and not row.enabled):
            continue
        declared = adapter.config.embedding_dimensions
        if declared is not None and adapter.supports("embeddings"):
            return declared
    return None


def may_try(
    name: str,
    row: Provider | None,
    adapter: BaseProvider | None,
    request: AuditRequest,
    *,
    denied: frozenset[str] = frozenset(),
    budget: Budget | None = None,
    forced: bool = False,
    needs: frozenset[str] = frozenset(),
    claim: bool = True,
    drained: bool = False,
    context_floor: int | None = None,
) -> Steps[str | None]:
    """None when the candidate may be tried now, else the reason it is skipped.

    ``denied``: the candidates the caller may not use; ``budget``: the request's (None:
    a fresh one is assumed); ``forced``: a forced call (a row without an adapter is
    ``unknown_provider`` even when disabled); ``needs``: capabilities beyond the
    request's own (continuation: ``prefill``); ``claim``: the circuit through ``Allow``
    (may claim the half-open probe slot), else read only (``PeekCircuit``: explain);
    ``drained``: its weight in its step is 0; ``context_floor``: the largest declared
    context window that failed with a context-length error so far (:func:`too_small`)."""
    if adapter is not None and any(not adapter.supports(c) for c in needs):
        return "unsupported"  # the mock too: it is a backstop, not a continuation
    if name == MOCK_PROVIDER_NAME:
        return None
    if name in denied:
        return "not_allowed"
    if row is None or (forced and adapter is None):
        return "unknown_provider"
    if not row.enabled:
        return "disabled"
    if drained:
        return "drained"
    if adapter is None:
        return "unknown_provider"
    if adapter.requires_key and not row.key_present:
        return "missing_key"
    if missing_capability(adapter, request, needs) is not None:
        return "unsupported"
    if too_small(row, context_floor):
        return "context_too_small"
    expected, declared = request.expected_dimensions, adapter.config.embedding_dimensions
    if request.call == "embed" and None not in (expected, declared) and expected != declared:
        return "dimension_mismatch"
    if budget is not None and not budget.can_start():
        return "budget_exhausted"
    allowed = yield from (Allow(adapter.config) if claim else PeekCircuit(adapter.config))
    return None if allowed else "circuit_open"
