"""The dashboard's "spend per provider / user" tables for its window (issue 15, item 6).

Requests come from the RoutingDecision rows of the window (per serving provider, and
per caller's ``user_pk``; anonymous callers and the Python API are one "—" row). Token
and cost columns appear only when the decision rows carry them (``input_tokens``,
``output_tokens``, ``cost_usd``): they are summed when the fields exist, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Count, Q, Sum

from .models import RoutingDecision

__all__ = ["SPEND_FIELDS", "TOP_USERS", "Spend", "SpendRow", "spend"]

#: Optional decision fields summed per row when the model has them.
SPEND_FIELDS = ("input_tokens", "output_tokens", "cost_usd")
TOP_USERS = 10


@dataclass(frozen=True)
class SpendRow:
    name: str
    requests: int
    sums: dict[str, Any] = field(default_factory=dict)  # field name -> total


@dataclass(frozen=True)
class Spend:
    columns: tuple[str, ...]  # the SPEND_FIELDS the rows carry
    providers: list[SpendRow]
    users: list[SpendRow]


def _columns() -> tuple[str, ...]:
    names = {f.name for f in RoutingDecision._meta.concrete_fields}
    return tuple(f for f in SPEND_FIELDS if f in names)


def _rows(since: datetime, key: str, columns: tuple[str, ...], limit: int | None) -> list[Any]:
    sums = {c: Sum(c) for c in columns}
    query = (
        RoutingDecision.objects.filter(created_at__gte=since)
        .values(key)
        .annotate(n=Count("*"), **sums)
        .order_by("-n", key)
    )
    return list(query[:limit] if limit else query)


def _sums(row: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in columns:
        value = row.get(c)
        out[c] = value.normalize() if isinstance(value, Decimal) else (value or 0)
    return out


def spend(since: datetime, *, top_users: int = TOP_USERS) -> Spend:
    """Requests (and tokens/cost when recorded) per serving provider and per user."""
    columns = _columns()
    providers = [
        SpendRow(r["selected_provider"] or "—", r["n"], _sums(r, columns))
        for r in _rows(since, "selected_provider", columns, None)
    ]
    by_user = _rows(since, "user_pk", columns, top_users)
    user_model = get_user_model()
    pks = [r["user_pk"] for r in by_user if r["user_pk"]]
    names: dict[str, str] = {}
    if pks:
        for pk, name in user_model._default_manager.filter(Q(pk__in=pks)).values_list(
            "pk", user_model.USERNAME_FIELD
        ):
            names[str(pk)] = str(name)
    users = [
        SpendRow(
            names.get(r["user_pk"], f"#{r['user_pk']}") if r["user_pk"] else "—",
            r["n"],
            _sums(r, columns),
        )
        for r in by_user
    ]
    return Spend(columns=columns, providers=providers, users=users)
