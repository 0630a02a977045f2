"""Server-sent events framing for the streaming responses."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["SSE_HEADERS", "sse"]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data: Any, *, event: str | None = None) -> bytes:
    """One SSE event; ``data`` is JSON-encoded unless it is already a string."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return (head + "".join(f"data: {line}\n" for line in payload.split("\n")) + "\n").encode()
