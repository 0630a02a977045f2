"""One boundary for text in: every value a request or a configuration file carries is
checked once, where it enters, by one walk (:func:`problems`).

The rules (docs/operations.md, "Input"), for every string (dict keys included), number
and JSON container, at any depth:

* **Unicode scalar values only.** A lone surrogate (``"\\ud800"`` in JSON) is refused: it
  cannot be encoded as UTF-8, so it could be neither hashed, recorded, logged nor sent.
* **No NUL** (U+0000) in any string: PostgreSQL text cannot hold it and upstreams treat it
  differently. Nowhere allowed.
* **Finite numbers.** ``NaN``, ``Infinity`` and a literal too large for a float (``1e400``
  parses to infinity) are refused; integers fit in 64 bits (signed).
* **One nesting limit,** ``MAX_JSON_DEPTH``, for every JSON value: a request body, the JSON
  text inside tool-call ``arguments``, explain's ``schema`` parameter, a TOML file.

Where it runs: the HTTP JSON parser (every body of every face, :mod:`llm_routing.api.parsers`)
marks what it checked with :class:`CheckedObject`; the root request serializers check
anything not so marked (the Python API: :func:`llm_routing.audit`, :func:`llm_routing.chat`;
explain's query) — so each value is walked exactly once. JSON carried as text inside a
value (tool-call arguments, explain's schema) goes through :func:`parse_json_text`.

The walk keeps its own stack (no recursion: a 50,000-deep value is refused, never a
``RecursionError``) and stops at the first problem, named by its path
(``messages.0.name``). Messages never echo the value.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from .conf import routing_settings

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "CheckedObject",
    "InputRefused",
    "check",
    "parse_json_text",
    "problems",
    "text_problem",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: A path part longer than this (or a key that is itself refused) is shown as ``(key)``.
_MAX_SHOWN_KEY = 64

Path = tuple[str | int, ...]


class InputRefused(ValueError):
    """A value the boundary refuses: where (``path``) and why (``reason``, never the value)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason

    @property
    def place(self) -> str:
        """The path as text: ``messages.0.name`` (empty at the root)."""
        return ".".join(str(p) for p in self.path)

    def __str__(self) -> str:
        return f"{self.place}: {self.reason}" if self.path else self.reason

    def as_detail(self) -> Any:
        """DRF's error shape, as the chat serializers name places: the field, then the
        item, then the dotted place inside it — ``{"messages": {"0": {"content.1.text":
        ["…"]}}}``, ``{"metadata": {"k": ["…"]}}`` (``["…"]`` at the root)."""
        parts = [str(p) for p in self.path]
        if len(parts) > 2:
            parts[2:] = [".".join(parts[2:])]
        detail: Any = [self.reason]
        for part in reversed(parts):
            detail = {part: detail}
        return detail


class CheckedObject(dict[str, Any]):
    """A JSON object already walked by :func:`check` (the HTTP parser's output): the
    serializers do not walk it again."""


def text_problem(text: str) -> str | None:
    """Why ``text`` is refused (NUL, a lone surrogate), or None."""
    if "\x00" in text:
        return "Null characters are not allowed."
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            code = ord(text[exc.start])
            return f"Lone surrogate characters are not allowed (U+{code:04X})."
    return None


def _shown(key: object) -> str:
    if isinstance(key, str) and len(key) <= _MAX_SHOWN_KEY and text_problem(key) is None:
        return key
    return "(key)"


def problems(
    value: Any, *, path: Path = (), max_depth: int | None = None
) -> Iterator[InputRefused]:
    """Every problem of ``value`` by the rules above, in document order, without
    recursion; a container past ``max_depth`` (``MAX_JSON_DEPTH``) is one problem and is
    not entered. ``path`` prefixes the paths (the value's place in a larger one)."""
    limit = int(routing_settings.MAX_JSON_DEPTH if max_depth is None else max_depth)
    # Paths are built only for a problem: each entered value remembers its parent's
    # entry in ``trail`` and its key; the stack holds (value, trail index, depth).
    trail: list[tuple[int, str | int]] = []
    stack: list[tuple[Any, int, int]] = [(value, -1, 0)]

    def where(index: int) -> Path:
        parts: list[str | int] = []
        while index >= 0:
            index, key = trail[index]
            parts.append(key)
        return (*path, *reversed(parts))

    while stack:
        item, at, depth = stack.pop()
        kind = type(item)
        if kind is str or isinstance(item, str):
            if "\x00" in item or not item.isascii():
                reason = text_problem(item)
                if reason:
                    yield InputRefused(where(at), reason)
        elif kind is bool or item is None:
            continue
        elif kind is int or isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                yield InputRefused(where(at), "Integers must fit in 64 bits (signed).")
        elif kind is float or isinstance(item, float):
            if item - item != 0:  # NaN and ±Infinity (inf - inf is NaN)
                yield InputRefused(
                    where(at), "NaN and Infinity are not allowed (numbers are finite)."
                )
        elif kind is dict or kind is list or isinstance(item, Mapping | list | tuple):
            if depth >= limit:
                yield InputRefused(where(at), f"JSON nested deeper than {limit} levels.")
                continue
            children: list[tuple[Any, int, int]] = []
            if kind is dict or (kind is not list and isinstance(item, Mapping)):
                for key, child in item.items():
                    if type(key) is not str and not isinstance(key, str):
                        yield InputRefused(where(at), "Object keys must be strings.")
                        continue
                    if "\x00" in key or not key.isascii():
                        reason = text_problem(key)
                        if reason:
                            yield InputRefused(where(at), f"In a key: {reason}")
                            continue
                    trail.append((at, _shown(key)))
                    children.append((child, len(trail) - 1, depth + 1))
            else:
                for i, child in enumerate(item):
                    trail.append((at, i))
                    children.append((child, len(trail) - 1, depth + 1))
            stack.extend(reversed(children))  # document order


def check(value: Any, *, path: Path = (), max_depth: int | None = None) -> None:
    """Raise :class:`InputRefused` for the first problem of ``value``."""
    for problem in problems(value, path=path, max_depth=max_depth):
        raise problem


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed (numbers are finite)")


def parse_json_text(
    text: str, *, path: Path = (), max_depth: int | None = None, max_chars: int | None = None
) -> Any:
    """JSON carried as text inside a value (tool-call ``arguments``, explain's
    ``schema``): parsed, then checked like any other value. Raises
    :class:`InputRefused` at ``path`` for text that is not JSON, is longer than
    ``max_chars``, nests deeper than ``MAX_JSON_DEPTH`` or breaks a rule above."""
    limit = int(routing_settings.MAX_JSON_DEPTH if max_depth is None else max_depth)
    if max_chars is not None and len(text) > max_chars:
        raise InputRefused(path, f"The JSON text is too long (more than {max_chars} characters).")
    reason = text_problem(text)
    if reason:
        raise InputRefused(path, reason)
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise InputRefused(path, f"JSON nested deeper than {limit} levels.") from None
    except ValueError as exc:
        message = str(exc) if "not allowed" in str(exc) else "Expected valid JSON text."
        raise InputRefused(path, message[:200]) from None
    check(value, path=path, max_depth=limit)
    return value
