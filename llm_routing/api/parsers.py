"""A JSON parser with a body-size cap (413) and a nesting-depth cap (400)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser

from ..conf import routing_settings

__all__ = ["LimitedJSONParser", "PayloadTooLarge", "json_depth"]


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body too large."
    default_code = "payload_too_large"


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, computed without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item)
    return deepest


class LimitedJSONParser(JSONParser):
    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        limit = int(routing_settings.MAX_REQUEST_BYTES)
        request = (parser_context or {}).get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        try:
            if declared and int(declared) > limit:
                raise PayloadTooLarge(f"Request body exceeds {limit} bytes.")
        except ValueError:
            raise ParseError("Invalid Content-Length header.") from None
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(f"Request body exceeds {limit} bytes.")
        try:
            text = raw.decode((parser_context or {}).get("encoding") or "utf-8")
            data = json.loads(text)
        except RecursionError:
            raise ParseError("JSON nested too deeply.") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        max_depth = int(routing_settings.MAX_JSON_DEPTH)
        if json_depth(data) > max_depth:
            raise ParseError(f"JSON nested deeper than {max_depth} levels.")
        return data
