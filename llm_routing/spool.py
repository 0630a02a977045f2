"""The decision spool: routing decisions the database would not take, kept on disk.

When :func:`llm_routing.recorder.record_or_spool` cannot write a decision (the database
is down, read-only, out of connections), the decision and its attempts — the same
fields as the rows, never the input or the output — are appended as one JSON line to
``<SPOOL_DIR>/decisions.jsonl``. :func:`llm_routing.recorder.flush_spool` (the
``llm_routing_spool_flush`` command, the ``llm_routing.flush_decision_spool`` task)
writes them once the database is back.

File protocol (no database here):

* **append** — one ``os.write`` of one line on an ``O_APPEND`` descriptor, under an
  exclusive ``flock`` where the platform has it, so concurrent processes never
  interleave lines;
* **claim** — a flush first renames ``decisions.jsonl`` to
  ``decisions.<time>.<pid>.claimed`` (atomic), so new decisions go to a fresh file
  while it works; a claimed file is deleted only once every line in it is written
  (or is already in the database), and a later flush picks up any claimed file left
  over by a flush that failed half-way.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .conf import routing_settings

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["CURRENT", "REJECTED", "append", "append_many", "claim", "lines", "spool_dir"]

logger = logging.getLogger("llm_routing.spool")

CURRENT = "decisions.jsonl"
REJECTED = "rejected.jsonl"


def spool_dir() -> Path | None:
    """The configured directory (created when missing), or None when spooling is off."""
    value = routing_settings.SPOOL_DIR
    if not value:
        return None
    path = Path(value)
    path.mkdir(parents=True, exist_ok=True)
    return path


def append(rows: dict[str, Any], *, name: str = CURRENT) -> Path | None:
    """Append one decision as a JSON line; the file, or None when spooling is off."""
    return append_many([rows], name=name)


def append_many(batch: Sequence[dict[str, Any]], *, name: str = CURRENT) -> Path | None:
    """Append decisions as JSON lines in one write and one ``fsync`` (a write-behind
    batch the database refused); the file, or None when spooling is off."""
    directory = spool_dir()
    if directory is None:
        return None
    target = directory / name
    data = b"".join(
        (json.dumps(rows, ensure_ascii=True, sort_keys=True) + "\n").encode("ascii")
        for rows in batch
    )
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:  # a regular file takes it whole; a short write is finished
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)  # also releases the lock
    return target


def claim() -> list[Path]:
    """Files to flush: left-over claimed files, then the current file (renamed)."""
    directory = spool_dir()
    if directory is None:
        return []
    current = directory / CURRENT
    if current.exists():
        claimed = directory / f"decisions.{time.time_ns()}.{os.getpid()}.claimed"
        try:
            os.rename(current, claimed)
        except FileNotFoundError:  # another flush claimed it first
            pass
    return sorted(directory.glob("decisions.*.claimed"))


def lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-empty line."""
    with path.open(encoding="ascii", errors="replace") as handle:
        for number, text in enumerate(handle, start=1):
            if text.strip():
                yield number, text
