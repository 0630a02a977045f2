"""The failure policy: what each kind of failure means for the request (the table in
docs/architecture.md, "Failure policy"). The one place it is decided.

A bottom module: it imports nothing of the app, so both :mod:`llm_routing.errors`
(whose classes take their policy from here) and :mod:`llm_routing.types` (whose
:class:`~llm_routing.types.ErrorInfo` carries it to the walk and the breaker) read it.
The retry layer, the walk and the breaker read the policy the error carries; none
re-derives it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Policy", "policy_for"]


@dataclass(frozen=True, slots=True)
class Policy:
    """What one kind of failure means.

    ``transient``: a momentary condition (the taxonomy's ``TransientError`` side);
    ``retryable``: the retry layer may try the same provider again (an error instance
    may tighten it, e.g. a quota that waiting will not refill); ``advances``: the walk
    moves on to the next candidate (else it stops with this error); ``counts``: the
    failure counts toward opening the provider's circuit; ``observed``: the circuit is
    fed the failure at all (False: it says nothing of the provider's health)."""

    transient: bool
    retryable: bool
    advances: bool
    counts: bool
    observed: bool = True


_TRANSIENT = Policy(transient=True, retryable=True, advances=True, counts=True)
_STOPS = Policy(transient=False, retryable=False, advances=False, counts=False)

#: Error kind (``ProviderError.category``) -> its policy.
_TABLE: dict[str, Policy] = {
    # 429: retried honouring Retry-After up to a cap (over the cap: not retried).
    "rate_limit": _TRANSIENT,
    # 500/502/503/504/529: retried with backoff and full jitter.
    "unavailable": _TRANSIENT,
    # connect error, reset.
    "network": _TRANSIENT,
    # no response / first-token timeout: a silent route is not retried.
    "timeout": Policy(transient=True, retryable=False, advances=True, counts=True),
    # a timeout only the request-wide deadline caused: says nothing of the provider.
    "budget_exhausted": Policy(
        transient=True, retryable=False, advances=True, counts=False, observed=False
    ),
    # 400 context length exceeded: another model may take it.
    "context_length": Policy(transient=False, retryable=False, advances=True, counts=False),
    "authentication": _STOPS,  # 401/403
    "invalid_request": _STOPS,  # 400/404/422, schema errors
    "content_policy": _STOPS,
    "response": _STOPS,  # an unparsable body
    # the client went away: says nothing of the provider.
    "client_disconnected": Policy(
        transient=False, retryable=False, advances=False, counts=False, observed=False
    ),
}


def policy_for(kind: str, *, transient: bool = False) -> Policy:
    """The policy of the error kind ``kind``. A kind that is no provider failure (a
    skip reason such as ``circuit_open``, ``chain_exhausted``) is not in the table: it
    advances and counts as its ``transient`` flag says, and is observed."""
    policy = _TABLE.get(kind)
    if policy is not None:
        return policy
    return Policy(transient=transient, retryable=False, advances=transient, counts=transient)
