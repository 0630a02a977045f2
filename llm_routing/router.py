"""The routing algorithm — the only place that walks a chain (docs/architecture.md).

1. Resolve the chain: ``force_provider`` (mode ``forced``) → exactly that provider;
   otherwise the first matching enabled RoutingRule (``rule``), else the default
   Chain, else ``LLM_ROUTING["ROUTES"][route]`` / ``["DEFAULT_CHAIN"]`` (``default``);
   a chain named by the caller (``chain``, the ``/v1`` face's ``model``) replaces both;
   an explicit ``provider`` (``explicit``) goes first. Candidates are
   ``[primary, *fallbacks, "mock"]``, de-duplicated, mock always last.
2. Availability: ``unknown_provider``, ``disabled``, ``missing_key``, ``circuit_open``,
   ``unsupported`` (a capability the request needs — :func:`missing_capability`),
   ``dimension_mismatch`` (an embeddings request: another declared vector length),
   ``budget_exhausted`` (the request-wide deadline or attempt budget
   leaves no room for a real call) — each skip recorded and announced through
   ``on_provider_fallback``.
3. Attempt through the retry layer; transient and context-length failures advance,
   anything else stops the walk with that error result.
4. Exhausted → the mock answers; without a backstop (``request.backstop`` False and
   no ``Chain.mock_backstop``, as on ``/v1``) → an error result ``chain_exhausted``.

:func:`route` never raises on a well-formed :class:`AuditRequest`.

The public face of the routing core (:mod:`llm_routing.routing`, one module per job:
``plan``, ``walk``, ``stream``, ``explain``): every other part imports from here.
"""

from __future__ import annotations

from .availability import missing_capability
from .explanation import CandidateExplanation, Explanation
from .routing.explain import explain
from .routing.plan import Plan, Setup, resolve, with_output_ceiling
from .routing.stream import aroute_stream, route_stream
from .routing.walk import aroute, route

__all__ = [
    "CandidateExplanation",
    "Explanation",
    "Plan",
    "Setup",
    "aroute",
    "aroute_stream",
    "explain",
    "missing_capability",
    "resolve",
    "route",
    "route_stream",
    "with_output_ceiling",
]
