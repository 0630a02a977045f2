"""Translation helpers shared by the vendor adapters for chat requests: data: URLs,
tool-call arguments as objects, compact JSON, and the system text of a conversation.

Each adapter owns its own wire shape (``openai.py``, ``anthropic.py``, ``gemini.py``);
only what two or more of them need lives here. Nothing here touches the network.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from ..errors import InvalidRequestError
from ..types import Message, ToolCall

__all__ = [
    "arguments_object",
    "compact_json",
    "data_url",
    "split_system",
]

_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)(?:;[^,;]*)*?;base64,(?P<data>.*)$", re.S)
_BASE64 = re.compile(r"^[A-Za-z0-9+/\s]*=*\s*$")


def compact_json(value: Any) -> str:
    """The JSON text of ``value`` without spaces (OpenAI's ``arguments`` style)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def arguments_object(call: ToolCall) -> dict[str, Any]:
    """A tool call's ``arguments`` as the JSON object vendors other than OpenAI want
    (empty text → ``{}``); anything else is the caller's invalid request."""
    text = call.arguments.strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidRequestError(
            f"The arguments of tool call {call.id!r} are not valid JSON."
        ) from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"The arguments of tool call {call.id!r} are not a JSON object.")
    return value


def data_url(url: str) -> tuple[str, str] | None:
    """``(media_type, base64 data)`` of a base64 ``data:`` URL; None for other URLs.
    A ``data:`` URL that is not base64 is an invalid request."""
    if not url.startswith("data:"):
        return None
    match = _DATA_URL.match(url)
    if match is None:
        raise InvalidRequestError("An image data: URL must be base64 with a media type.")
    data = match.group("data")
    if not _BASE64.match(data):
        raise InvalidRequestError("An image data: URL does not hold base64 data.")
    return match.group("type"), data


def split_system(conversation: Iterable[Message]) -> tuple[str, list[Message]]:
    """The text of every system/developer turn (joined by a blank line, in order) and
    the remaining turns — for vendors whose API takes instructions apart."""
    system: list[str] = []
    turns: list[Message] = []
    for message in conversation:
        if message.role in ("system", "developer"):
            if message.text:
                system.append(message.text)
        else:
            turns.append(message)
    return "\n\n".join(system), turns
