"""Cost per attempt, in USD (docs/observability.md).

An attempt's cost is its reported tokens times its provider's price:

- a provider row with ``input_price_per_mtok`` and ``output_price_per_mtok`` set uses
  them (self-hosted or negotiated prices; USD per million tokens);
- otherwise the `genai-prices` package's bundled price data (pinned, read offline —
  its auto-update is never started) for the row's vendor: ``openai`` → ``openai``,
  ``anthropic`` → ``anthropic``, ``gemini`` → ``google``, ``openai_compatible`` →
  found by the row's ``base_url``. The model looked up is the one the vendor reported,
  then the row's configured model;
- the offline mock costs nothing.

A failed attempt that reported no tokens costs 0 (a 503 consumes nothing); an answer
whose tokens were not reported (a server that ignores the stream usage option, a
stream cut after text) and a price that cannot be found are ``None`` — never a guess.
A failed attempt that consumed tokens is charged. A skipped candidate has no cost. A
request's cost is the sum of its attempts' costs, ``None`` when any is unknown.

The served attempt's tokens are the result's usage (for a stream, the final event's);
the other attempts' are :attr:`AttemptRecord.usage`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import genai_prices
from genai_prices import data_snapshot

from . import snapshot
from .dbconn import on_event_loop
from .types import MOCK_PROVIDER_NAME, AttemptRecord, RoutingResult, Usage

__all__ = [
    "VENDOR_PRICE_IDS",
    "Costs",
    "PriceSource",
    "attempt_cost",
    "costs",
    "envelope",
    "format_usd",
    "price",
    "sources",
    "total_usd",
]

logger = logging.getLogger("llm_routing.pricing")

#: Provider kind → the price package's provider id (openai_compatible: by base_url).
VENDOR_PRICE_IDS = {"openai": "openai", "anthropic": "anthropic", "gemini": "google"}

MTOK = Decimal(1_000_000)


@dataclass(frozen=True, slots=True)
class PriceSource:
    """What pricing needs to know of one provider row."""

    kind: str
    model: str = ""
    base_url: str = ""
    input_per_mtok: Decimal | None = None
    output_per_mtok: Decimal | None = None
    offline: bool = False

    @property
    def overridden(self) -> bool:
        return self.input_per_mtok is not None and self.output_per_mtok is not None


@dataclass(frozen=True, slots=True)
class Costs:
    """A routed request's costs: one per attempt (None for a skip or an unknown price)
    and the request's total."""

    attempts: tuple[Decimal | None, ...]
    total: Decimal | None


def price(source: PriceSource, model: str, usage: Usage) -> Decimal | None:
    """USD for ``usage`` on ``source`` (``model`` is the reported model), or None."""
    if source.offline:
        return Decimal(0)
    if usage.input_tokens == 0 and usage.output_tokens == 0:
        return Decimal(0)
    if source.overridden:
        assert source.input_per_mtok is not None and source.output_per_mtok is not None
        return (
            usage.input_tokens * source.input_per_mtok
            + usage.output_tokens * source.output_per_mtok
        ) / MTOK
    return _package_price(source, model, usage)


def _package_price(source: PriceSource, model: str, usage: Usage) -> Decimal | None:
    where: dict[str, Any]
    if source.kind in VENDOR_PRICE_IDS:
        where = {"provider_id": VENDOR_PRICE_IDS[source.kind]}
    elif source.kind == "openai_compatible" and source.base_url:
        where = {"provider_api_url": source.base_url}
    else:
        return None
    for ref in dict.fromkeys(m for m in (model, source.model) if m):
        found = _lookup(tuple(sorted(where.items())), ref)
        if found is None:
            continue
        if isinstance(found, tuple):  # flat per-token prices: the package's own sum
            per_input, per_output = found
            return (usage.input_tokens * per_input + usage.output_tokens * per_output) / MTOK
        tokens = genai_prices.Usage(
            input_tokens=usage.input_tokens, output_tokens=usage.output_tokens
        )
        return Decimal(genai_prices.calc_price(tokens, ref, **where).total_price)
    return None


#: The package's answer per (where, model): None (unknown), (input, output) USD per
#: million tokens when both are flat and nothing else applies to a text call, or True
#: (tiered or per-request prices: ask ``calc_price`` each time). Kept for an hour
#: (a price may change on a date the data names).
_lookups: dict[tuple[Any, str], tuple[float, bool | tuple[Decimal, Decimal] | None]] = {}
_LOOKUP_TTL_S = 3600.0
_LOOKUP_MAX = 10_000


def _lookup(where: tuple[tuple[str, Any], ...], ref: str) -> bool | tuple[Decimal, Decimal] | None:
    now = time.monotonic()
    hit = _lookups.get((where, ref))
    if hit is not None and now - hit[0] < _LOOKUP_TTL_S:
        return hit[1]
    answer: bool | tuple[Decimal, Decimal] | None
    kwargs = dict(where)
    try:
        _, model_info = data_snapshot.get_snapshot().find_provider_model(
            ref, None, kwargs.get("provider_id"), kwargs.get("provider_api_url")
        )
    except LookupError:
        answer = None
    else:
        prices = model_info.get_prices(datetime.now(tz=UTC))
        set_prices = {k: v for k, v in vars(prices).items() if v is not None}
        flat = all(isinstance(set_prices.get(k), Decimal) for k in ("input_mtok", "output_mtok"))
        per_call = any(
            not (k.endswith("_mtok") or k.endswith("searches_kcount")) for k in set_prices
        )
        answer = (
            (set_prices["input_mtok"], set_prices["output_mtok"]) if flat and not per_call else True
        )
    if len(_lookups) < _LOOKUP_MAX or (where, ref) in _lookups:
        _lookups[(where, ref)] = (now, answer)
    return answer


# --- provider rows ---------------------------------------------------------------------


def sources(names: Iterable[str]) -> dict[str, PriceSource | None]:
    """Price facts of the named provider rows (None: no such row), from the in-process
    configuration snapshot (llm_routing.snapshot: no query per request; a price change
    is live within its 1 s bound). Inside a running event loop the snapshot is taken as
    last built (the router's setup has just refreshed it), never rebuilt there."""
    snap = snapshot.latest() if on_event_loop() else snapshot.current()
    if snap is None:
        return {name: source_of(None, name) for name in names}
    global _sources
    held = _sources
    if held[0] is not snap:  # a new snapshot: its rows are new objects
        held = _sources = (snap, {})
    known = held[1]
    out: dict[str, PriceSource | None] = {}
    for name in names:
        if name in known:
            out[name] = known[name]
        else:
            # Bounded by the snapshot's rows (plus names that are no row: at most
            # _SOURCES_MAX of those are remembered).
            found = out[name] = source_of(snap.providers.get(name), name)
            if found is not None or len(known) < _SOURCES_MAX:
                known[name] = found
    return out


#: (the snapshot, its rows' price sources by name): one PriceSource per row and
#: snapshot, not one per request (rows of a snapshot never change).
_sources: tuple[Any, dict[str, PriceSource | None]] = (None, {})
_SOURCES_MAX = 256


def source_of(row: Any, name: str) -> PriceSource | None:
    """Where a provider row's price comes from (None: no row and not the mock)."""
    if row is None:
        return PriceSource(kind="mock", offline=True) if name == MOCK_PROVIDER_NAME else None
    return PriceSource(
        kind=row.kind,
        model=row.model,
        base_url=row.base_url,
        input_per_mtok=row.input_price_per_mtok,
        output_per_mtok=row.output_price_per_mtok,
        offline=row.effective_mode == "mock",
    )


# --- a routed request ------------------------------------------------------------------

_memo: OrderedDict[tuple[str, float], Costs] = OrderedDict()
_memo_lock = threading.Lock()
_MEMO_SIZE = 512


def attempt_cost(
    attempt: AttemptRecord, routed: RoutingResult, source: PriceSource | None
) -> Decimal | None:
    """One attempt's cost (None for a skip, an unknown provider or an unknown price)."""
    if attempt.outcome == "skipped" or source is None:
        return None
    if source.offline:
        return Decimal(0)
    usage = routed.result.usage if attempt.served else attempt.usage
    if usage is None or (usage.input_tokens == 0 and usage.output_tokens == 0):
        # Nothing reported. An answer (or a stream cut after text) consumed tokens that
        # were not counted: unknown. A failure before any answer consumed none.
        answered = attempt.outcome == "ok" or attempt.served or attempt.partial
        return None if answered else Decimal(0)
    return price(source, attempt.model, usage)


def costs(routed: RoutingResult) -> Costs:
    """The request's costs; computed once per routed request (the recorder, the
    metrics and the API share it)."""
    key = (routed.request_id, routed.total_latency_ms)
    with _memo_lock:
        if (hit := _memo.get(key)) is not None:
            return hit
    attempts = routed.metadata.attempts
    found = sources({a.provider for a in attempts if a.outcome != "skipped"})
    each = tuple(attempt_cost(a, routed, found.get(a.provider)) for a in attempts)
    charged = [c for a, c in zip(attempts, each, strict=True) if a.outcome != "skipped"]
    known = [c for c in charged if c is not None]
    total = sum(known, Decimal(0)) if len(known) == len(charged) else None
    out = Costs(attempts=each, total=total)
    with _memo_lock:
        _memo[key] = out
        while len(_memo) > _MEMO_SIZE:
            _memo.popitem(last=False)
    return out


def format_usd(value: Decimal | None) -> str | None:
    """A cost as JSON carries it: a decimal string (exact), or None."""
    return None if value is None else format(value.normalize(), "f")


def _number(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def envelope(routed: RoutingResult, shown: RoutingResult | None = None) -> dict[str, Any]:
    """``routed.to_dict()`` with ``cost_usd`` (a JSON number, or null when unknown) in
    ``routing_metadata`` / ``diagnostics`` and on each listed attempt — the shape of
    ``POST /audit/``'s answer, its stream's ``result`` event and a job's result.
    ``shown``: the copy of ``routed`` the caller may see
    (:func:`llm_routing.access.visible_routed`), priced from ``routed`` itself."""
    body = (shown or routed).to_dict()
    cost = costs(routed)
    by_index = {a.index: c for a, c in zip(routed.metadata.attempts, cost.attempts, strict=True)}
    attempted = [
        by_index.get(a.index) for a in (shown or routed).metadata.attempts if a.outcome != "skipped"
    ]
    for key in ("routing_metadata", "diagnostics"):
        meta = dict(body[key])
        meta["cost_usd"] = _number(cost.total)
        meta["attempts"] = [
            {**a, "cost_usd": _number(c)} for a, c in zip(meta["attempts"], attempted, strict=True)
        ]
        body[key] = meta
    return body


def total_usd(routed: RoutingResult) -> float | None:
    """The request's cost as a JSON number (``/v1``'s ``usage.cost_usd``), or None."""
    return _number(costs(routed).total)
