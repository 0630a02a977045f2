"""The API's side of budgets (docs/budgets.md): one call before the walk that turns a
:class:`~llm_routing.budgets.Refusal` into HTTP 429 (503 for a budget that fails closed
while its cache is down), with ``Retry-After``.

``/audit/`` answers ``{"budget", "window", "reset_at", "detail"}``; ``/v1`` answers the
same inside OpenAI's error envelope (:meth:`BudgetRefused.openai_body`).
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import APIException
from rest_framework.request import Request

from .. import budgets
from ..types import Principal

__all__ = ["BudgetRefused", "aenforce_budgets", "enforce_budgets"]


class BudgetRefused(APIException):
    status_code = 429
    default_code = "budget_exceeded"
    default_detail = "A budget is exhausted."

    def __init__(self, refusal: budgets.Refusal) -> None:
        super().__init__(code=refusal.code)
        self.refusal = refusal
        self.status_code = refusal.status
        self.detail: Any = refusal.body()  # as is: reset_at may be null
        self.wait = refusal.retry_after  # DRF's handler sends it as Retry-After

    def openai_body(self) -> dict[str, Any]:
        """OpenAI's error envelope with the budget's fields beside ``code``."""
        body = self.refusal.body()
        return {
            "error": {
                "message": body.pop("detail"),
                "type": "rate_limit_error" if self.status_code == 429 else "service_unavailable",
                "param": None,
                "code": self.refusal.code,
                **body,
            }
        }


def _token_key(request: Request) -> str | None:
    key = getattr(request.auth, "key", None)  # DRF's Token (Token and Bearer auth)
    return key if isinstance(key, str) else None


def enforce_budgets(request: Request, principal: Principal | None) -> None:
    """THE hook: count this request in its caller's budgets or raise :class:`BudgetRefused`.

    Call it once per routed request, after the access check and before routing."""
    refusal = budgets.check(principal, _token_key(request))
    if refusal is not None:
        raise BudgetRefused(refusal)


async def aenforce_budgets(request: Request, principal: Principal | None) -> None:
    """:func:`enforce_budgets` on the event loop (:func:`llm_routing.budgets.acheck`:
    one ``redis.asyncio`` round trip; a worker thread where the check would block)."""
    refusal = await budgets.acheck(principal, _token_key(request))
    if refusal is not None:
        raise BudgetRefused(refusal)
