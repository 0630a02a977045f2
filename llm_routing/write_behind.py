"""A bounded write-behind queue for routing decisions, drained by one background thread.

:func:`llm_routing.recorder.submit` puts a decision's rows (the JSON-ready form of
:func:`llm_routing.recorder.decision_rows`: lengths and hashes, never the input or the
output) on a bounded :class:`queue.Queue` and returns at once: no database access, no
wait, safe to call from an event loop. One daemon thread per process, started on the
first submit (and again in a forked child: the parent's queue and thread are not the
child's), takes what is queued in batches — up to ``batch_size`` records, or whatever
arrived within ``linger_s`` of the first — and hands each batch to ``write`` (one
transaction: one INSERT of the decisions, one of their attempts), which raises when the
database refused the batch, or returns the records it could not take one by one.

Nothing is dropped silently:

* a batch ``write`` refuses (any exception: the database is down, a table is locked)
  goes to ``spill`` (the spool, :mod:`llm_routing.spool`: one append, one ``fsync``),
  and so does a single record it returns as refused;
* a record submitted while the queue is full is spilled at once instead of waiting
  (a local file append, counted and logged);
* :meth:`WriteBehind.flush` waits until every record submitted before the call is
  written or spilled; the recorder flushes on interpreter exit (``atexit``).

What can be lost: the records still queued when the process dies without running its
exit handlers (``kill -9``, an OOM kill, a worker killed on timeout) — at most the
queue's bound (``RECORD_QUEUE_SIZE``) plus one batch in flight; and anything spilled
while the spool is off (``SPOOL_DIR`` unset), which is logged as lost.

The thread owns its database connection: it honours ``CONN_MAX_AGE`` and drops an
unusable connection before each batch (:func:`django.db.close_old_connections`),
closes the connection after a failed batch, and closes it when the queue has been
empty for ``idle_close_s``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import close_old_connections, connections

__all__ = ["Rows", "WriteBehind", "WriteBehindStats"]

logger = logging.getLogger("llm_routing.recorder")

Rows = dict[str, Any]

_NAP_S = 0.01  # longest sleep while a batch lingers for more records


@dataclass(frozen=True)
class WriteBehindStats:
    """Counters since the process started (or forked)."""

    submitted: int  # records accepted onto the queue
    written: int  # records written by the thread
    spooled: int  # records spilled to the spool (a failed batch or a full queue)
    lost: int  # records neither written nor spooled (spool off or unwritable)
    overflowed: int  # records that found the queue full (spooled or lost)
    queued: int  # records waiting now
    batches: int  # batches written (each one transaction)

    def to_dict(self) -> dict[str, int]:
        return {
            "submitted": self.submitted,
            "written": self.written,
            "spooled": self.spooled,
            "lost": self.lost,
            "overflowed": self.overflowed,
            "queued": self.queued,
            "batches": self.batches,
        }


class WriteBehind:
    """One bounded queue and its writer thread (per process)."""

    def __init__(
        self,
        *,
        write: Callable[[Sequence[Rows]], Sequence[Rows] | None],
        spill: Callable[[Sequence[Rows]], Path | None],
        maxsize: Callable[[], int],
        batch_size: int = 200,
        linger_s: float = 0.05,
        idle_close_s: float = 5.0,
        name: str = "llm-routing-recorder",
    ) -> None:
        self._write = write
        self._spill = spill
        self._maxsize = maxsize
        self.batch_size = batch_size
        self.linger_s = linger_s
        self.idle_close_s = idle_close_s
        self.name = name
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        """Forget the queue and the thread (a forked child has a copy of the parent's
        queue, whose records the parent writes, and no writer thread)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._settled_changed = threading.Condition(self._lock)
        self._queue: queue.Queue[Rows] | None = None
        self._thread: threading.Thread | None = None
        self._accepted = 0
        self._settled = 0  # accepted records written or spilled (or lost)
        self._hurry = threading.Event()  # a flush is waiting: stop lingering
        self._written = self._spooled = self._lost = self._overflowed = self._batches = 0

    # --- the request side (no database, no waiting) --------------------------------

    def submit(self, rows: Rows) -> None:
        """Queue *rows* for the writer thread; spill them when the queue is full."""
        target = self._ready()
        with self._lock:
            try:
                target.put_nowait(rows)
            except queue.Full:
                self._overflowed += 1
                overflowed = self._overflowed
            else:
                self._accepted += 1
                return
        kept = self._spill_safely([rows], "the write-behind queue is full")
        if overflowed == 1 or overflowed % 1000 == 0:
            logger.warning(
                "Write-behind queue full (RECORD_QUEUE_SIZE=%d): %d record(s) %s so far "
                "instead of waiting for the database.",
                target.maxsize,
                overflowed,
                "spooled" if kept else "spooled or lost",
            )

    def _ready(self) -> queue.Queue[Rows]:
        if self._pid != os.getpid():  # forked without register_at_fork
            self._reset()
        current, thread = self._queue, self._thread
        if current is not None and thread is not None and thread.is_alive():
            return current
        with self._lock:
            if self._queue is None:
                self._queue = queue.Queue(maxsize=max(1, int(self._maxsize())))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, args=(self._queue,), name=self.name, daemon=True
                )
                self._thread.start()
            return self._queue

    # --- waiting for it ------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every record submitted before this call is written or spooled;
        False when *timeout* seconds passed first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            goal = self._accepted
            if self._settled < goal:
                self._hurry.set()
            while self._settled < goal:
                if self._thread is None or not self._thread.is_alive():
                    break  # no writer (it died at interpreter shutdown): drain here
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._settled_changed.wait(remaining)
            else:
                return True
        self._drain_here()
        with self._lock:
            return self._settled >= goal

    def _drain_here(self) -> None:
        pending = self._queue
        if pending is None:
            return
        while True:
            batch: list[Rows] = []
            try:
                while len(batch) < self.batch_size:
                    batch.append(pending.get_nowait())
            except queue.Empty:
                pass
            if not batch:
                return
            self._commit(batch)

    def stats(self) -> WriteBehindStats:
        with self._lock:
            return WriteBehindStats(
                submitted=self._accepted,
                written=self._written,
                spooled=self._spooled,
                lost=self._lost,
                overflowed=self._overflowed,
                queued=self._queue.qsize() if self._queue is not None else 0,
                batches=self._batches,
            )

    # --- the writer thread ---------------------------------------------------------

    def _run(self, source: queue.Queue[Rows]) -> None:
        while True:
            try:
                first = source.get(timeout=self.idle_close_s)
            except queue.Empty:
                _close_connections()  # idle: hold no database connection
                continue
            batch = [first]
            until = time.monotonic() + self.linger_s
            while len(batch) < self.batch_size:
                remaining = until - time.monotonic()
                try:
                    if remaining <= 0 or self._hurry.is_set():
                        batch.append(source.get_nowait())
                    else:  # short naps, so that a flush need not wait out the linger
                        batch.append(source.get(timeout=min(remaining, _NAP_S)))
                except queue.Empty:
                    if remaining <= 0 or self._hurry.is_set():
                        break
            close_old_connections()  # CONN_MAX_AGE, and a connection gone bad
            if not self._commit(batch):
                _close_connections()  # never reuse a connection that just failed
            elif source.empty():
                close_old_connections()  # the end of a "request": CONN_MAX_AGE applies

    def _commit(self, batch: list[Rows]) -> bool:
        """Write *batch*, or spill it; never raises. True when written."""
        written = 0
        try:
            refused = list(self._write(batch) or ())
            written = len(batch) - len(refused)
            if refused:  # records the database will not take, written around
                self._spill_safely(refused, "refused by the database", log=True)
        except Exception as exc:  # the database refused: keep the batch on disk
            # The exception's text may quote the statement: its type only.
            self._spill_safely(batch, type(exc).__name__, log=True)
        finally:
            with self._lock:
                self._written += written
                self._batches += 1 if written else 0
                self._settled += len(batch)
                if self._settled >= self._accepted:
                    self._hurry.clear()
                self._settled_changed.notify_all()
        return written > 0

    def _spill_safely(self, batch: Sequence[Rows], problem: str, *, log: bool = False) -> bool:
        try:
            where = self._spill(batch)
        except Exception:
            logger.exception(
                "Could not spool %d routing decision(s) either (%s); they are lost.",
                len(batch),
                problem,
            )
            where = None
        else:
            if where is None:
                logger.error(
                    "Could not record %d routing decision(s) (%s); they are lost (set "
                    'LLM_ROUTING["SPOOL_DIR"] to keep such decisions).',
                    len(batch),
                    problem,
                )
            elif log:
                logger.warning(
                    "Could not record %d routing decision(s) (%s); spooled to %s "
                    "(manage.py llm_routing_spool_flush writes them).",
                    len(batch),
                    problem,
                    where,
                )
        with self._lock:
            if where is None:
                self._lost += len(batch)
            else:
                self._spooled += len(batch)
        return where is not None


def _close_connections() -> None:
    for connection in connections.all(initialized_only=True):
        try:
            connection.close()
        except Exception:  # a connection that cannot even close is gone anyway
            logger.debug("closing the writer's connection failed", exc_info=True)
