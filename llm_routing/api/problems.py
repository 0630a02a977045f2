"""What a routed or refused request that got no answer becomes, before an API face puts
it in its own envelope: a :class:`Problem` (status, kind, message, the field at fault,
a code, and for an exhausted chain every candidate the caller may see), and the routing
headers of a routed answer.

One place for what ``/v1/chat/completions`` (:mod:`~llm_routing.api.openai_compat`) and
the other ``/v1`` faces (:mod:`~llm_routing.api.faces`) share, so the statuses, the
candidate list and its message are the same on every face.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rest_framework import exceptions

from ..access import NOBODY, TRUSTED, Viewer, visible_routed
from ..types import RoutingResult
from .budget_guard import BudgetRefused

__all__ = [
    "CATEGORY_STATUS",
    "STATUS_KIND",
    "UNKNOWN_PARAMETER",
    "Problem",
    "exception_problem",
    "flatten",
    "routed_problem",
    "routing_headers",
]

#: router error category → (HTTP status, the problem's kind): the statuses of every
#: ``/v1`` face. Kinds: invalid_request, not_found, upstream, unavailable.
CATEGORY_STATUS: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "invalid_request"),
    "context_length": (400, "invalid_request"),
    "content_policy": (400, "invalid_request"),
    "unsupported": (400, "invalid_request"),
    "unknown_provider": (404, "not_found"),
    "authentication": (502, "upstream"),
    "response": (502, "upstream"),
    "chain_exhausted": (503, "unavailable"),
}

#: HTTP status of a refused request → the problem's kind.
STATUS_KIND: dict[int, str] = {
    400: "invalid_request",
    401: "authentication",
    403: "permission",
    404: "not_found",
    405: "invalid_request",
    406: "invalid_request",
    413: "too_large",
    415: "invalid_request",
    429: "rate_limit",
    501: "not_implemented",
    502: "upstream",
    503: "unavailable",
}


@dataclass(frozen=True, slots=True)
class Problem:
    """One error, before a face puts it in its envelope."""

    status: int
    kind: str  # invalid_request, authentication, permission, not_found, rate_limit …
    message: str
    param: str | None = None  # the request field at fault (400s)
    code: str | None = None  # a machine-readable code (unknown_parameter, budget code …)
    extra: Mapping[str, Any] = field(default_factory=dict)  # request_id, candidates, budget …


def flatten(detail: Any, prefix: str = "") -> tuple[str, str | None]:
    """DRF's nested error detail → (``"place: message"``, place) of its first error;
    places are dotted (``messages.2.content``)."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = "" if key == "non_field_errors" else str(key)
            path = f"{prefix}.{name}" if prefix and name else (name or prefix)
            return flatten(value, path)
    if isinstance(detail, list) and detail:
        return flatten(detail[0], prefix)
    return (f"{prefix}: {detail}" if prefix else str(detail)), (prefix or None)


UNKNOWN_PARAMETER = "unknown_parameter"


def exception_problem(exc: exceptions.APIException, status_code: int) -> Problem:
    """A refused request (validation, authentication, permission, throttle, budget …)."""
    kind = STATUS_KIND.get(status_code, "api")
    if isinstance(exc, BudgetRefused):
        body = exc.refusal.body()
        message = str(body.pop("detail"))
        return Problem(status_code, kind, message, code=exc.refusal.code, extra=body)
    message, param = flatten(exc.detail)
    codes = exc.get_codes()
    code = codes if isinstance(codes, str) else None
    if isinstance(exc, exceptions.ValidationError):
        code = "invalid_value"
        first = codes
        while isinstance(first, dict | list) and first:
            first = next(iter(first.values())) if isinstance(first, dict) else first[0]
        if first == UNKNOWN_PARAMETER:
            code = UNKNOWN_PARAMETER
        return Problem(status_code, kind, message, param=param, code=code)
    return Problem(status_code, kind, message, code=code)


def routing_headers(routed: RoutingResult, viewer: Viewer = TRUSTED) -> dict[str, str]:
    """``X-Request-ID``, ``X-LLM-Provider`` and ``X-LLM-Attempts`` (every try of every
    candidate that was not skipped) of a routed answer or error, as ``viewer`` may see
    it (:func:`llm_routing.access.visible_routed`: an error's last candidate may be one
    they may not use, skipped as ``not_allowed``; the header is then empty)."""
    shown = visible_routed(routed, viewer)
    attempts = [a for a in shown.metadata.attempts if a.outcome != "skipped"]
    return {
        "X-Request-ID": routed.request_id,
        "X-LLM-Provider": shown.result.provider,
        "X-LLM-Attempts": str(sum(a.retries + 1 for a in attempts)),
    }


def routed_problem(routed: RoutingResult, viewer: Viewer = NOBODY) -> Problem:
    """A routed request that got no answer: its status, and for an exhausted chain
    every candidate ``viewer`` may see with its outcome and reason (never a
    ``not_allowed`` skip: :func:`llm_routing.access.visible_routed`)."""
    err = routed.result.error
    category = err.category if err else "response"
    status_code, kind = CATEGORY_STATUS.get(category, (503, "unavailable"))
    message = err.message if err else "Every candidate failed."
    extra: dict[str, Any] = {}
    if category == "chain_exhausted":  # the caller's copy of the decision: access.visible_routed
        candidates = [
            {"provider": a.provider, "outcome": a.outcome, "reason": a.reason}
            for a in visible_routed(routed, viewer).metadata.attempts
        ]
        reasons = ", ".join(f"{c['provider']}: {c['reason']}" for c in candidates) or "none"
        message = f"No provider could answer (request {routed.request_id}; {reasons})."
        extra = {"request_id": routed.request_id, "candidates": candidates}
    return Problem(status_code, kind, message, code=category, extra=extra)
