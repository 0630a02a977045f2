"""May this candidate be tried now, and if not, why — the one availability decision.

:func:`may_try` is asked by every place that picks a candidate: the walk, a forced call,
continuation streaming (which also needs ``prefill``) and explain (which reads the
circuit without claiming a probe slot). Its reasons, in the order they are checked:

``not_allowed`` (the caller's access rules; never the mock) · ``unknown_provider`` (no
row, or — forced — no adapter for its kind) · ``disabled`` · ``unknown_provider`` (no
adapter for its kind) · ``missing_key`` · ``unsupported`` (a capability the request
needs: :func:`missing_capability`) · ``budget_exhausted`` (the request-wide deadline or
attempt budget leaves no room for a real call; checked before the circuit so a
half-open probe slot is never taken in vain) · ``circuit_open`` (last: the breaker's
``Allow`` effect, which may claim the half-open probe slot, or ``PeekCircuit``).

The mock backstop is always available, except for a capability asked beyond the
request's own (``needs``: continuation's ``prefill``).
"""

from __future__ import annotations

from .effects import Steps
from .models import Provider
from .providers.base import BaseProvider
from .resilience.breaker import Allow, PeekCircuit
from .resilience.budget import Budget
from .types import CAPABILITIES, MOCK_PROVIDER_NAME, AuditRequest

__all__ = ["SKIP_REASONS", "may_try", "missing_capability"]

#: Every reason :func:`may_try` can give, in the order it checks them.
SKIP_REASONS = (
    "not_allowed",
    "unknown_provider",
    "disabled",
    "missing_key",
    "unsupported",
    "budget_exhausted",
    "circuit_open",
)


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
) -> Steps[str | None]:
    """None when the candidate may be tried now, else the reason it is skipped.

    ``denied``: the candidates the caller may not use; ``budget``: the request's (None:
    a fresh one is assumed); ``forced``: a forced call (a row without an adapter is
    ``unknown_provider`` even when disabled); ``needs``: capabilities beyond the
    request's own (continuation: ``prefill``); ``claim``: the circuit through ``Allow``
    (may claim the half-open probe slot), else read only (``PeekCircuit``: explain)."""
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
    if adapter is None:
        return "unknown_provider"
    if adapter.requires_key and not row.key_present:
        return "missing_key"
    if missing_capability(adapter, request, needs) is not None:
        return "unsupported"
    if budget is not None and not budget.can_start():
        return "budget_exhausted"
    allowed = yield from (Allow(adapter.config) if claim else PeekCircuit(adapter.config))
    return None if allowed else "circuit_open"
