"""Answers as they may leave the router: no key value anywhere, no echoed input in errors.

Errors were always scrubbed by value; an upstream can also echo the key inside a
*successful* answer (content, structured data, the model name it reports) or echo the
caller's input inside an error message. :func:`sanitized` cleans a
:class:`~llm_routing.types.ProviderResult` before the router records it, returns it or
hands it to a job row or a command; :class:`StreamGuard` is the one filter every
streamed event passes before it leaves the router (text and tool-call fragments — id,
name, arguments — with a key split across chunks held back until it can be told, model
names, and the final event's error); :class:`KeyGuard` is its per-string part; :func:`redacted`
cleans a failure after a stream's commit point.

Key values are those of :func:`llm_routing.logging.known_key_values` (every key
variable read in this process), read when cleaning.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from .errors import REDACTED, ProviderError, scrub
from .logging import known_key_values
from .types import (
    AuditRequest,
    ErrorInfo,
    ProviderResult,
    RouterStreamEvent,
    StreamChunk,
    StreamFailure,
    StreamResult,
    ToolCallDelta,
)

__all__ = [
    "TRIGGER_CHARS",
    "JsonEscapes",
    "KeyGuard",
    "StreamGuard",
    "redacted",
    "sanitized",
    "scrub_error",
]


def _clean(value: Any, secrets: list[str]) -> Any:
    """Every string inside ``value`` (dict keys included) with key values scrubbed."""
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, dict):
        return {_clean(k, secrets): _clean(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v, secrets) for v in value]
    return value


def _scrub_json_text(text: str, secrets: list[str]) -> str:
    """JSON carried as text (a tool call's arguments) with key values scrubbed however
    the upstream spelled them: as written, and as a JSON decoder reads them (``\\u``
    escapes); re-encoded only when a decoded value held a key."""
    text = scrub(text, secrets)
    try:
        value = json.loads(text)
    except ValueError:
        return text
    cleaned = _clean(value, secrets)
    return text if cleaned == value else json.dumps(cleaned, ensure_ascii=False)


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
                arguments=_scrub_json_text(call.arguments, secrets),
            )
            for call in result.tool_calls
        ),
        error=scrub_error(result.error, request) if result.error else None,
    )


#: How much of a key's beginning makes a stream hold text back (see :class:`KeyGuard`).
TRIGGER_CHARS = 4


class KeyGuard:
    """Scrubs key values out of streamed text, even a key split across chunks, without
    telling anything of a key by *when* it lets text go.

    Holding back "the longest tail that could begin a key" would be an oracle: a caller
    who can make the upstream echo a guess sees its tail held back (merged into the next
    frame) exactly when the guess is a prefix of the key, and recovers the key a
    character at a time. Here the hold-back depends on a key's first
    :data:`TRIGGER_CHARS` characters only (usually its vendor's public prefix, such as
    ``sk-``): from the first place where they stand (or could begin, at the end of the
    text), text is held until the longest key length has arrived — however the rest
    compares with any key — then a whole key there is redacted and the scan goes on.
    Ordinary text, with no key's beginning in it, is never held back."""

    def __init__(self, secrets: list[str]) -> None:
        self.secrets = secrets
        self.pending = ""

    def feed(self, text: str) -> str:
        secrets = [s for s in self.secrets if len(s) >= 4]  # what scrub() redacts
        if not secrets:
            return scrub(self.pending + text, self.secrets) if self.pending else text
        buf, out, start = self.pending + text, [], 0
        longest = max(len(s) for s in secrets)
        while True:
            at = _trigger(buf, start, secrets)
            if at is None:
                out.append(buf)
                self.pending = ""
                break
            if len(buf) - at < longest:  # wait for the longest key length, whatever it holds
                out.append(buf[:at])
                self.pending = buf[at:]
                break
            key = next((s for s in secrets if buf.startswith(s, at)), None)
            if key is None:
                start = at + 1
                continue
            out.append(buf[:at] + REDACTED)
            buf, start = buf[at + len(key) :], 0
        return "".join(out)

    def flush(self) -> str:
        rest, self.pending = self.pending, ""
        return scrub(rest, self.secrets)


def _trigger(text: str, start: int, secrets: list[str]) -> int | None:
    """The first place at or after ``start`` where a key's first characters stand, or
    could begin (a tail of ``text`` that is a prefix of them)."""
    best: int | None = None
    for secret in secrets:
        head = secret[:TRIGGER_CHARS]
        found = text.find(head, start)
        if found < 0:  # a key's beginning cut off by the end of the text
            for at in range(max(start, len(text) - len(head) + 1), len(text)):
                if head.startswith(text[at:]):
                    found = at
                    break
        if found >= 0 and (best is None or found < best):
            best = found
    return best


class JsonEscapes:
    """Streamed JSON text (tool-call arguments, in fragments) with its ``\\u`` and
    ``\\/`` escapes written as the characters they stand for, wherever that character
    may stand raw in a JSON string (not a quote, a backslash, a control character or a
    lone surrogate): the text means the same to any JSON decoder, and the key filter
    behind it sees a key however the upstream spelled it. An escape cut by a fragment's
    end waits for the next fragment."""

    def __init__(self) -> None:
        self.pending = ""

    def feed(self, text: str) -> str:
        s, out, i = self.pending + text, [], 0
        while i < len(s):
            slash = s.find("\\", i)
            if slash < 0:
                out.append(s[i:])
                i = len(s)
                break
            out.append(s[i:slash])
            i = slash
            size, char = _escape_at(s, i)
            if size == 0:  # cut by the fragment's end
                break
            out.append(char if char is not None else s[i : i + size])
            i += size
        self.pending = s[i:]
        return "".join(out)

    def flush(self) -> str:
        rest, self.pending = self.pending, ""
        return rest


def _hex4(text: str) -> int | None:
    if len(text) == 4 and all(c in "0123456789abcdefABCDEF" for c in text):
        return int(text, 16)
    return None


def _escape_at(s: str, i: int) -> tuple[int, str | None]:
    """The escape starting at ``s[i]`` (a backslash): its length and the character to
    write instead (None: keep it as written); length 0 when the text ends inside it."""
    if i + 1 >= len(s):
        return 0, None
    kind = s[i + 1]
    if kind == "/":
        return 2, "/"
    if kind != "u":
        return 2, None
    if i + 6 > len(s):
        return 0, None
    code = _hex4(s[i + 2 : i + 6])
    if code is None:
        return 2, None
    if 0xD800 <= code < 0xDC00:  # a high surrogate: the pair makes one character
        if i + 12 > len(s) and "\\u".startswith(s[i + 6 : i + 8]):
            return 0, None  # its low half may come with the next fragment
        low = _hex4(s[i + 8 : i + 12]) if s[i + 6 : i + 8] == "\\u" else None
        if low is not None and 0xDC00 <= low < 0xE000:
            return 12, chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))
        return 6, None
    if code < 0x20 or chr(code) in '"\\' or 0xDC00 <= code < 0xE000:
        return 6, None
    return 6, chr(code)


class StreamGuard:
    """The one key filter for everything a stream hands its caller (every face, both
    drivers: the router's stream core emits nothing that has not passed it).

    Text and each tool call's ``arguments`` (per call ``index``) go through a
    :class:`KeyGuard` each, so a key split across fragments is caught; a fragment whose
    arguments are all held back is still sent when it carries the call's ``id`` or
    ``name`` (scrubbed whole: they come in one piece). :meth:`flush` hands over what is
    held back at the end; :meth:`final` scrubs the final event (the routed result again
    — idempotent — and a failure's message)."""

    def __init__(self, request: AuditRequest) -> None:
        self.request = request
        # One list shared by every KeyGuard here, brought up to date at each event: a
        # key variable is first read when its provider is called, after this was made.
        self.secrets: list[str] = known_key_values()
        self.text = KeyGuard(self.secrets)
        self.arguments: dict[int, KeyGuard] = {}
        self.escapes: dict[int, JsonEscapes] = {}

    def _current(self) -> list[str]:
        values = known_key_values()
        if values != self.secrets:
            self.secrets[:] = values
        return self.secrets

    def chunk(self, chunk: StreamChunk) -> StreamChunk | None:
        """``chunk`` as it may leave, or None when all of it is held back for now."""
        secrets = self._current()
        model = scrub(chunk.model, secrets)
        delta = chunk.tool_call
        if delta is not None:
            guard = self.arguments.setdefault(delta.index, KeyGuard(secrets))
            escapes = self.escapes.setdefault(delta.index, JsonEscapes())
            arguments = guard.feed(escapes.feed(delta.arguments))
            if not arguments and delta.id is None and delta.name is None:
                return None
            clean = ToolCallDelta(
                index=delta.index,
                id=None if delta.id is None else scrub(delta.id, secrets),
                name=None if delta.name is None else scrub(delta.name, secrets),
                arguments=arguments,
            )
            return replace(chunk, text=scrub(chunk.text, secrets), model=model, tool_call=clean)
        text = self.text.feed(chunk.text)
        if not text:
            return None
        return replace(chunk, text=text, model=model)

    def flush(self, provider: str, model: str) -> list[StreamChunk]:
        """What is still held back (text first, then each call's arguments in order)."""
        model = scrub(model, self._current())
        out: list[StreamChunk] = []
        if rest := self.text.flush():
            out.append(StreamChunk(rest, provider=provider, model=model))
        for index in sorted(self.arguments):
            guard = self.arguments[index]
            if rest := guard.feed(self.escapes[index].flush()) + guard.flush():
                delta = ToolCallDelta(index=index, arguments=rest)
                out.append(StreamChunk("", provider=provider, model=model, tool_call=delta))
        return out

    def final(self, event: StreamResult | StreamFailure) -> RouterStreamEvent:
        """The final event as it may leave: its routed result has passed
        :func:`sanitized` in the router's exit (the same object ``request_routed``
        carried, kept as is); a failure's error message is scrubbed."""
        if isinstance(event, StreamResult):
            return event
        error = scrub_error(event.error, self.request)
        return event if error is event.error else replace(event, error=error)


def redacted(exc: ProviderError) -> ProviderError:
    """A failure after the commit point, where no retry layer scrubs: key values out
    of its message before it reaches the caller, the breaker, the rows or the logs."""
    exc.message = scrub(exc.message, known_key_values())[:500]
    exc.args = (exc.message,)
    return exc
