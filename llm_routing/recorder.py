"""The only writer of routing logs: one RoutingDecision + its Attempt rows per request.

Written in one transaction, so a request is logged whole or not at all. The input is
stored as its length and SHA-256 only; no output, prompt or key is ever stored.

Every string is fitted to its column before the insert (:func:`fit`): a route key of 64
characters makes ``chain_name = "route:<key>"`` longer than its column, and a vendor
reports whatever model name it likes. A value that is too long is cut and ends with
``…``; NUL characters (which PostgreSQL refuses in text) are dropped.

:func:`decision_rows` is the JSON-ready form of what :func:`record` writes (the spool,
:mod:`llm_routing.spool`, keeps exactly that when the database cannot be written);
:func:`write_rows` writes one, :func:`write_batch` many (one transaction, one INSERT of
the decisions and one of all their attempts).

Two ways in: :func:`record_or_spool` writes before it returns (``RECORD_MODE =
"inline"``, the sync default); :func:`submit` queues the rows for a background writer
(:mod:`llm_routing.write_behind`; ``RECORD_MODE = "write_behind"``, and always on the
async path) and :func:`flush` waits for it. Both spool what the database refuses.
"""

from __future__ import annotations

import atexit
import json
import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import DatabaseError, DataError, IntegrityError, models, transaction
from django.utils import timezone

from . import pricing, spool
from .conf import routing_settings
from .models import Attempt, RoutingDecision
from .types import AuditRequest, RoutingResult
from .write_behind import WriteBehind, WriteBehindStats

__all__ = [
    "FlushReport",
    "decision_rows",
    "fit",
    "flush",
    "flush_spool",
    "missing_decisions",
    "record",
    "record_or_spool",
    "submit",
    "write_batch",
    "write_behind_stats",
    "write_queued",
    "write_rows",
]

logger = logging.getLogger("llm_routing.recorder")

# Attempt rows per INSERT: 13 columns each stays under PostgreSQL's 65,535 parameters.
ATTEMPTS_PER_INSERT = 4000
# Longest wait for the write-behind queue on interpreter exit.
EXIT_FLUSH_TIMEOUT_S = 10.0


def fit(model: type[models.Model], values: dict[str, Any]) -> dict[str, Any]:
    """*values* with every string cut to its ``CharField``'s ``max_length``."""
    fitted = dict(values)
    for name, value in values.items():
        if not isinstance(value, str):
            continue
        field = model._meta.get_field(name)
        if not isinstance(field, models.CharField):
            continue
        value = value.replace("\x00", "")
        limit = field.max_length
        if limit and len(value) > limit:
            value = value[: limit - 1] + "…"
        fitted[name] = value
    return fitted


def _user_pk(request: AuditRequest) -> str:
    user_id = request.principal.user_id if request.principal is not None else None
    return "" if user_id is None else str(user_id)


def decision_rows(request: AuditRequest, routed: RoutingResult) -> dict[str, Any]:
    """The decision and its attempts as plain JSON values (no input, no output)."""
    meta = routed.metadata
    cost = pricing.costs(routed)
    return {
        "decision": {
            "request_id": str(routed.request_id),
            "task": request.task,
            "route": request.route or "",
            "rule": meta.rule or "",
            "router_mode": meta.router_mode,
            "chain_name": meta.chain_name or "",
            "requested_provider": meta.requested_provider or "",
            "selected_provider": meta.selected_provider or "",
            "fallback_used": meta.fallback_used,
            "fallback_reason": meta.fallback_reason or "",
            "status": routed.result.status,
            "mode": routed.result.mode,
            "input_length": request.input_length,
            "input_sha256": request.input_sha256,
            "total_latency_ms": routed.total_latency_ms,
            "user_pk": _user_pk(request),
            "hedge": meta.hedge or "",
            "cost_usd": pricing.format_usd(cost.total),
            "created_at": timezone.now().isoformat(),
        },
        "attempts": [
            {
                "index": a.index,
                "provider": a.provider,
                "model": a.model,
                "outcome": a.outcome,
                "reason": a.reason or "",
                "error_category": a.error_category or "",
                "http_status": a.http_status,
                "transient": a.transient,
                "retries": a.retries,
                "latency_ms": a.latency_ms,
                "served": a.served,
                "partial": a.partial,
                "step": a.step,
                "cost_usd": pricing.format_usd(c),
            }
            for a, c in zip(meta.attempts, cost.attempts, strict=True)
        ],
    }


def write_batch(batch: Sequence[dict[str, Any]]) -> list[RoutingDecision]:
    """Insert decisions and all their attempts: one transaction, one INSERT of the
    decisions and one of the attempts (strings fitted), whatever the batch's size.

    A decision keeps its ``created_at`` (when it was decided) when the rows carry one.
    """
    decisions: list[RoutingDecision] = []
    for rows in batch:
        values = dict(rows["decision"])
        created_at = values.pop("created_at", None)
        decision = RoutingDecision(**fit(RoutingDecision, values))
        if created_at:
            decision.created_at = (
                datetime.fromisoformat(created_at) if isinstance(created_at, str) else created_at
            )
        decisions.append(decision)
    with transaction.atomic():
        RoutingDecision.objects.bulk_create(decisions)
        if any(decision.pk is None for decision in decisions):  # no RETURNING (MySQL)
            _fetch_ids(decisions)
        Attempt.objects.bulk_create(
            [
                Attempt(decision=decision, **fit(Attempt, dict(a)))
                for decision, rows in zip(decisions, batch, strict=True)
                for a in rows["attempts"]
            ],
            batch_size=ATTEMPTS_PER_INSERT,
        )
    return decisions


def _fetch_ids(decisions: list[RoutingDecision]) -> None:
    wanted = [uuid.UUID(str(d.request_id)) for d in decisions]
    ids = dict(
        RoutingDecision.objects.filter(request_id__in=wanted).values_list("request_id", "pk")
    )
    for decision, request_id in zip(decisions, wanted, strict=True):
        decision.pk = ids[request_id]


def write_rows(rows: dict[str, Any], *, keep_created_at: bool = False) -> RoutingDecision:
    """Insert one decision and its attempts in one transaction (strings fitted).

    ``keep_created_at`` stores the time the decision was made (the spool's replay)
    instead of now.
    """
    if not keep_created_at:
        decision = {k: v for k, v in rows["decision"].items() if k != "created_at"}
        rows = {**rows, "decision": decision}
    return write_batch([rows])[0]


def record(request: AuditRequest, routed: RoutingResult) -> RoutingDecision:
    return write_rows(decision_rows(request, routed))


def record_or_spool(request: AuditRequest, routed: RoutingResult) -> None:
    """Record the decision; when the database refuses, spool it (``SPOOL_DIR``).

    With ``RECORD_MODE = "inline"`` (the default) the rows are written before this
    returns; with ``"write_behind"`` they are handed to :func:`submit`.
    Never raises: the caller has an answer to give whatever happens here.
    """
    if routing_settings.RECORD_MODE == "write_behind":
        submit(request, routed)
        return
    try:
        rows = decision_rows(request, routed)
    except Exception as exc:
        # Nothing to write or spool; the router's exit still charges the request.
        logger.error(
            "Could not build the record of routing decision %s (%s); it is lost.",
            routed.request_id,
            type(exc).__name__,
        )
        return
    try:
        write_rows(rows)
        return
    except Exception as exc:
        # The exception's text may quote the statement: its type only.
        problem = type(exc).__name__
    try:
        where = spool.append(rows)
    except Exception:
        logger.exception("Could not spool routing decision %s either", routed.request_id)
        return
    if where is None:
        logger.error(
            "Could not record routing decision %s (%s); it is lost (set "
            'LLM_ROUTING["SPOOL_DIR"] to keep such decisions).',
            routed.request_id,
            problem,
        )
    else:
        logger.warning(
            "Could not record routing decision %s (%s); spooled to %s "
            "(manage.py llm_routing_spool_flush writes it).",
            routed.request_id,
            problem,
            where,
        )


# --- write-behind (llm_routing.write_behind) -------------------------------------------

# What the database (or the field) says about one record, not about the database.
_REFUSED = (IntegrityError, DataError, ValidationError)


def write_queued(batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The writer thread's write: :func:`write_batch`; when the database refuses one of
    its records (a constraint, a value out of range), the batch is written one record
    per transaction instead, so the others are not held back. A record whose request id
    is already recorded is skipped; the others it refuses are returned (to spool).
    Any other database error is raised (the whole batch is spooled)."""
    try:
        write_batch(batch)
        return []
    except _REFUSED:
        if len(batch) == 1:
            return [] if _recorded(batch[0]) else list(batch)
    refused = []
    for rows in batch:
        try:
            write_batch([rows])
        except _REFUSED:
            if not _recorded(rows):
                refused.append(rows)
    return refused


def _recorded(rows: dict[str, Any]) -> bool:
    try:
        request_id = uuid.UUID(str(rows["decision"]["request_id"]))
    except ValueError:
        return False
    return RoutingDecision.objects.filter(request_id=request_id).exists()


_writer = WriteBehind(
    write=write_queued,
    spill=spool.append_many,
    maxsize=lambda: int(routing_settings.RECORD_QUEUE_SIZE),
)


def submit(request: AuditRequest, routed: RoutingResult) -> None:
    """Queue the decision for the background writer and return at once.

    No database access and no waiting (safe on an event loop): the rows — the same
    fields :func:`record` writes, never the input or the output — go on a bounded queue
    (``RECORD_QUEUE_SIZE``) that one thread per process writes in batches; a batch the
    database refuses, or a record that finds the queue full, is spooled. Never raises.
    """
    try:
        _writer.submit(decision_rows(request, routed))
    except Exception:
        logger.exception("Could not queue routing decision %s", routed.request_id)


def flush(timeout: float = 5.0) -> bool:
    """Wait until every decision submitted so far is written (or spooled); False when
    *timeout* seconds passed first. Called on interpreter exit too. It blocks: on an
    event loop, ``await asyncio.to_thread(recorder.flush)``."""
    return _writer.flush(timeout)


def write_behind_stats() -> WriteBehindStats:
    """This process's write-behind counters (submitted, written, spooled, lost, ...)."""
    return _writer.stats()


@atexit.register
def _flush_at_exit() -> None:
    if _writer.stats().submitted and not _writer.flush(EXIT_FLUSH_TIMEOUT_S):
        left = _writer.stats().queued
        logger.error("Exiting with %d routing decision(s) not yet written; they are lost.", left)


def missing_decisions(request_ids: Iterable[str]) -> set[str]:
    """The ids among *request_ids* that have no decision row (an id that is not a UUID
    cannot have one). The benchmark checks every answered request id with it."""
    wanted: dict[uuid.UUID, str] = {}
    missing: set[str] = set()
    for text in request_ids:
        try:
            wanted[uuid.UUID(text.strip())] = text
        except ValueError:
            missing.add(text)
    ids = list(wanted)
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        found = set(
            RoutingDecision.objects.filter(request_id__in=chunk).values_list(
                "request_id", flat=True
            )
        )
        missing.update(wanted[i] for i in chunk if i not in found)
    return missing


@dataclass(frozen=True)
class FlushReport:
    written: int = 0
    already_recorded: int = 0
    rejected: int = 0
    left: int = 0  # lines still spooled because the database failed mid-flush

    def to_dict(self) -> dict[str, int]:
        return {
            "written": self.written,
            "already_recorded": self.already_recorded,
            "rejected": self.rejected,
            "left": self.left,
        }


def flush_spool() -> FlushReport:
    """Write every spooled decision not yet in the database (idempotent: ``request_id``
    is unique). A line that can never be written (malformed) moves to ``rejected.jsonl``;
    a database error stops the flush and leaves the file for the next one."""
    written = already = rejected = left = 0
    for path in spool.claim():
        pending = list(spool.lines(path))
        for position, (_, text) in enumerate(pending):
            try:
                rows = json.loads(text)
                request_id = rows["decision"]["request_id"]
                if RoutingDecision.objects.filter(request_id=request_id).exists():
                    already += 1
                    continue
                write_rows(rows, keep_created_at=True)
                written += 1
            except IntegrityError:
                already += 1  # a concurrent flush (or the router) wrote it first
            except DatabaseError as exc:
                left += len(pending) - position
                logger.warning(
                    "Spool flush stopped (%s); %d decision(s) left in %s",
                    type(exc).__name__,
                    len(pending) - position,
                    path.name,
                )
                return FlushReport(written, already, rejected, left)
            except (ValueError, KeyError, TypeError, ValidationError) as exc:
                rejected += 1
                logger.error("Spooled line rejected (%s); kept in %s", exc, spool.REJECTED)
                _reject(text)
        path.unlink(missing_ok=True)  # a concurrent flush may have finished it first
    return FlushReport(written, already, rejected, left)


def _reject(text: str) -> None:
    directory = spool.spool_dir()
    if directory is not None:
        with (directory / spool.REJECTED).open("a", encoding="ascii", errors="replace") as f:
            f.write(text if text.endswith("\n") else text + "\n")
