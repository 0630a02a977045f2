"""The dashboard's "spend per provider / user" tables for its window (issue 15, item 6).

Requests come from the RoutingDecision rows of the window (per serving provider, and
per caller's ``user_pk``; anonymous callers and the Python API are one "—" row). Token
and cost columns appear only when the decision rows carry them (``input_tokens``,
``output_tokens``, ``cost_usd``): they are summed when the fields exist, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Count, Sum

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


def _add(
    into: dict[str, dict[str, Any]], key: str, row: Mapping[str, Any], cols: tuple[str, ...]
) -> None:
    acc = into.setdefault(key, {"n": 0, **{c: None for c in cols}})
    acc["n"] += row["n"]
    for c in cols:
        if row[c] is not None:
            acc[c] = row[c] if acc[c] is None else acc[c] + row[c]


def _sums(acc: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in columns:
        value = acc.get(c)
        out[c] = value.normalize() if isinstance(value, Decimal) else (value or 0)
    return out


def spend(since: datetime, *, top_users: int = TOP_USERS) -> Spend:
    """Requests (and tokens/cost when recorded) per serving provider and per user: one
    aggregate query grouped by (provider, user) over the window's index, folded here."""
    columns = _columns()
    rows = (
        RoutingDecision.objects.filter(created_at__gte=since)
        .values("selected_provider", "user_pk")
        .annotate(n=Count("*"), **{c: Sum(c) for c in columns})
        .order_by()
    )
    by_provider: dict[str, dict[str, Any]] = {}
    by_user: dict[str, dict[str, Any]] = {}
    for row in rows:
        _add(by_provider, row["selected_provider"], row, columns)
        _add(by_user, row["user_pk"], row, columns)
    providers = [
        SpendRow(name or "—", acc["n"], _sums(acc, columns))
        for name, acc in sorted(by_provider.items(), key=lambda kv: (-kv[1]["n"], kv[0]))
    ]
    top = sorted(by_user.items(), key=lambda kv: (-kv[1]["n"], kv[0]))[:top_users]
    user_model = get_user_model()
    pks = [pk for pk, _ in top if pk]
    names: dict[str, str] = {}
    if pks:
        for pk, name in user_model._default_manager.filter(pk__in=pks).values_list(
            "pk", user_model.USERNAME_FIELD
        ):
            names[str(pk)] = str(name)
    users = [
        SpendRow(names.get(pk, f"#{pk}") if pk else "—", acc["n"], _sums(acc, columns))
        for pk, acc in top
    ]
    return Spend(columns=columns, providers=providers, users=users)
