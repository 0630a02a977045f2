"""Answers as they may leave the router: no key value anywhere, no echoed input in errors.

Errors were always scrubbed by value; an upstream can also echo the key inside a
*successful* answer (content, structured data, the model name it reports) or echo the
caller's input inside an error message. :func:`sanitized` cleans a
:class:`~llm_routing.types.ProviderResult` before the router records it, returns it or
hands it to a job row or a command; :class:`KeyGuard` does the same for streamed text,
chunk by chunk; :func:`redacted` for a failure after a stream's commit point.

Key values are those of :func:`llm_routing.logging.known_key_values` (every key
variable read in this process), read when cleaning.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from .errors import ProviderError, scrub
from .logging import known_key_values
from .types import AuditRequest, ErrorInfo, ProviderResult

__all__ = ["KeyGuard", "redacted", "sanitized", "scrub_error"]


def _clean(value: Any, secrets: list[str]) -> Any:
    """Every string inside ``value`` (dict keys included) with key values scrubbed."""
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, dict):
        return {_clean(k, secrets): _clean(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v, secrets) for v in value]
    return value


def _input_echoes(request: AuditRequest) -> list[str]:
    """The forms in which an upstream error message may echo the caller's input."""
    texts = [t for t in (request.input_text, request.instructions) if t]
    texts += [m.text for m in request.messages if m.text]  # every turn of a conversation
    forms = {*texts, *(json.dumps(t, ensure_ascii=False)[1:-1] for t in texts)}
    forms.update(line for t in texts for line in t.splitlines() if len(line.strip()) >= 8)
    return sorted(forms, key=len, reverse=True)


def scrub_error(error: ErrorInfo, request: AuditRequest) -> ErrorInfo:
    """An error's message without key values and without the caller's input echoed."""
    message = scrub(scrub(error.message, known_key_values()), _input_echoes(request))
    return error if message == error.message else replace(error, message=message)


def sanitized(result: ProviderResult, request: AuditRequest) -> ProviderResult:
    """The answer as it may reach a caller, a job row or a command's output: key values
    scrubbed from every string of it (an upstream may echo the key in its content,
    structured data or model name), the input scrubbed from its error message."""
    secrets = known_key_values()
    return replace(
        result,
        output=scrub(result.output, secrets),
        model=scrub(result.model, secrets),
        data=_clean(result.data, secrets),
        finish_reason=_clean(result.finish_reason, secrets),
        tool_calls=tuple(
            replace(
                call,
                id=scrub(call.id, secrets),
                name=scrub(call.name, secrets),
                arguments=scrub(call.arguments, secrets),
            )
            for call in result.tool_calls
        ),
        error=scrub_error(result.error, request) if result.error else None,
    )


class KeyGuard:
    """Scrubs key values out of streamed text, even a key split across chunks: the
    longest tail of the text so far that could begin a key is held back until the next
    chunk shows whether it does (ordinary text is never held back)."""

    def __init__(self, secrets: list[str]) -> None:
        self.secrets = secrets
        self.pending = ""

    def feed(self, text: str) -> str:
        if not self.secrets:
            return text
        pending = scrub(self.pending + text, self.secrets)
        hold = self._key_prefix_len(pending)
        self.pending = pending[len(pending) - hold :] if hold else ""
        return pending[: len(pending) - hold]

    def flush(self) -> str:
        rest, self.pending = self.pending, ""
        return rest

    def _key_prefix_len(self, text: str) -> int:
        best = 0
        for secret in self.secrets:
            for size in range(min(len(secret) - 1, len(text)), best, -1):
                if secret.startswith(text[-size:]):
                    best = size
                    break
        return best


def redacted(exc: ProviderError) -> ProviderError:
    """A failure after the commit point, where no retry layer scrubs: key values out
    of its message before it reaches the caller, the breaker, the rows or the logs."""
    exc.message = scrub(exc.message, known_key_values())[:500]
    exc.args = (exc.message,)
    return exc
