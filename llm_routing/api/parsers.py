"""A JSON parser with a body-size cap (413) and the input boundary (400).

Every body it parses goes through :func:`llm_routing.boundary.check` — lone surrogates,
NUL, NaN / Infinity, integers past 64 bits and nesting past ``MAX_JSON_DEPTH`` are a 400
naming the field — and is handed on as a :class:`~llm_routing.boundary.CheckedObject`
so that the serializers do not walk it again.

It is deliberately not a ``JSONParser`` subclass: DRF hands JSON parsers
``request.body``, which Django refuses past ``DATA_UPLOAD_MAX_MEMORY_SIZE`` with its own
HTML 400. This parser reads the stream itself, so every oversized body gets the
documented 413 (the OpenAI error envelope on ``/v1``) whatever that setting says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from rest_framework import renderers, status
from rest_framework.exceptions import APIException, ParseError, ValidationError
from rest_framework.parsers import BaseParser
from rest_framework.settings import api_settings

from ..boundary import CheckedObject, InputRefused, check
from ..conf import routing_settings

__all__ = ["LimitedJSONParser", "PayloadTooLarge"]

#: An oversized body is read and discarded up to this many bytes before the 413, so the
#: client (still sending) reads the answer instead of a reset connection; a body larger
#: than this gets the 413 and the connection is closed without reading the rest.
DRAIN_MAX_BYTES = 16 * 1024 * 1024
_CHUNK = 65_536


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body too large."
    default_code = "payload_too_large"


def _drain(stream: IO[Any] | None, declared: int) -> None:
    left = min(declared, DRAIN_MAX_BYTES)
    while stream is not None and left > 0:
        chunk = stream.read(min(_CHUNK, left))
        if not chunk:
            return
        left -= len(chunk)


def _detail(exc: InputRefused) -> Any:
    """The refusal in DRF's error shape, always an object: a problem of the body as a
    whole (a bad key at its top level) goes under ``non_field_errors`` as a serializer's
    would, never as a bare list (the documented 400 is an object on every face)."""
    detail = exc.as_detail()
    return detail if isinstance(detail, dict) else {api_settings.NON_FIELD_ERRORS_KEY: detail}


class LimitedJSONParser(BaseParser):
    media_type = "application/json"
    renderer_class = renderers.JSONRenderer

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
            length = int(declared) if declared else 0
        except ValueError:
            raise ParseError("Invalid Content-Length header.") from None
        if length > limit:
            _drain(stream, length)
            raise PayloadTooLarge(f"Request body exceeds {limit} bytes.")
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            _drain(stream, max(0, length - len(raw)))
            raise PayloadTooLarge(f"Request body exceeds {limit} bytes.")
        try:
            text = raw.decode((parser_context or {}).get("encoding") or "utf-8")
            data = json.loads(text)
        except RecursionError:
            raise ParseError("JSON nested too deeply.") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        try:
            check(data)
        except InputRefused as exc:
            raise ValidationError(_detail(exc)) from None
        return CheckedObject(data) if isinstance(data, dict) else data
