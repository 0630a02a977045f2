"""What the ``/v1`` faces beyond chat completions share: one view that validates,
translates into the router's :class:`~llm_routing.types.AuditRequest`, routes (the
same ``execute`` / ``route_stream`` as ``/v1/chat/completions``: the same chains,
rules, skips, retries, failover, circuits, budgets, throttles, permissions, records,
metrics and costs) and translates the answer back, in the face's own shapes and error
envelope.

A face is a :class:`Face`: pure translation functions with no request or view state,
so another caller (an ASGI lane, a benchmark) can run the same steps:

1. ``face.parse(data)`` → :class:`Parsed` (the ``AuditRequest`` and what the answer
   needs), raising DRF's ``ValidationError`` naming the field;
2. the router: ``execute`` (whole) or ``route_stream`` (streamed);
3. ``face.body(routed, parsed)`` for a whole answer, ``face.frames(request_id,
   parsed)`` for a stream (a callable turning each router event into SSE frames),
   ``face.error_body(Problem)`` for any error (:func:`routed_problem` for a routed one,
   :func:`exception_problem` for a refused request).

Faces: :mod:`~llm_routing.api.messages_face` (Anthropic Messages) and
:mod:`~llm_routing.api.responses_face` (OpenAI Responses).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from django.http import StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string
from drf_spectacular.utils import OpenApiExample, OpenApiResponse
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request
from rest_framework.response import Response

from .. import snapshot
from ..access import NOBODY, Viewer, may_see, viewer_for
from ..conf import routing_settings
from ..logging import current_request_id
from ..router import aroute_stream, route_stream
from ..service import aexecute, execute
from ..types import AuditRequest, RouterStreamEvent, RoutingResult, StreamChunk, StreamResult
from .authentication import TokenAuthentication
from .base import RoutingAPIView
from .budget_guard import BudgetRefused
from .openai_compat import model_not_found, visible_model
from .reuse import reused
from .sse import SSENegotiationMixin, aclose_events, closing_events, sse_response

__all__ = [
    "Face",
    "FaceView",
    "Frames",
    "Parsed",
    "Problem",
    "exception_problem",
    "flatten",
    "routed_problem",
    "routing_headers",
    "schema_entry",
    "select_model",
]

#: router error category → (HTTP status, the problem's kind); the same statuses as
#: ``/v1/chat/completions``. Kinds: invalid_request, not_found, upstream, unavailable.
CATEGORY_STATUS: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "invalid_request"),
    "context_length": (400, "invalid_request"),
    "content_policy": (400, "invalid_request"),
    "unsupported": (400, "invalid_request"),
    "unknown_provider": (404, "not_found"),
    "authentication": (502, "upstream"),
    "response": (502, "upstream"),
    "chain_exhausted": (503, "unavailable"),
}

#: HTTP status of a refused request → the problem's kind.
STATUS_KIND: dict[int, str] = {
    400: "invalid_request",
    401: "authentication",
    403: "permission",
    404: "not_found",
    405: "invalid_request",
    406: "invalid_request",
    413: "too_large",
    415: "invalid_request",
    429: "rate_limit",
    501: "not_implemented",
    502: "upstream",
    503: "unavailable",
}


@dataclass(frozen=True, slots=True)
class Problem:
    """One error, before a face puts it in its envelope."""

    status: int
    kind: str  # invalid_request, authentication, permission, not_found, rate_limit …
    message: str
    param: str | None = None  # the request field at fault (400s)
    code: str | None = None  # a machine-readable code (unknown_parameter, budget code …)
    extra: Mapping[str, Any] = field(default_factory=dict)  # request_id, candidates, budget …


@dataclass(frozen=True, slots=True)
class Parsed:
    """A validated request: the router's request and what the answer echoes back."""

    request: AuditRequest
    echo: Mapping[str, Any] = field(default_factory=dict)


def select_model(model: str) -> dict[str, Any]:
    """``model`` → a chain, a route key, or a provider name (the lookup order of
    ``/v1/chat/completions``); 404 naming it otherwise (the words of a hidden one)."""
    config = snapshot.current()  # no configuration rows on the request path
    if config.chain(model) is not None:
        return {"chain": model}
    if model in (routing_settings.ROUTES or {}) or config.has_route_rule(model):
        return {"route": model}
    if model == "mock" or config.provider(model) is not None:
        return {"provider": model}
    raise model_not_found(model)


def flatten(detail: Any, prefix: str = "") -> tuple[str, str | None]:
    """DRF's nested error detail → (``"place: message"``, place) of its first error;
    places are dotted (``messages.2.content``)."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = "" if key == "non_field_errors" else str(key)
            path = f"{prefix}.{name}" if prefix and name else (name or prefix)
            return flatten(value, path)
    if isinstance(detail, list) and detail:
        return flatten(detail[0], prefix)
    return (f"{prefix}: {detail}" if prefix else str(detail)), (prefix or None)


UNKNOWN_PARAMETER = "unknown_parameter"


def exception_problem(exc: exceptions.APIException, status_code: int) -> Problem:
    """A refused request (validation, authentication, permission, throttle, budget …)."""
    kind = STATUS_KIND.get(status_code, "api")
    if isinstance(exc, BudgetRefused):
        body = exc.refusal.body()
        message = str(body.pop("detail"))
        return Problem(status_code, kind, message, code=exc.refusal.code, extra=body)
    message, param = flatten(exc.detail)
    codes = exc.get_codes()
    code = codes if isinstance(codes, str) else None
    if isinstance(exc, exceptions.ValidationError):
        code = "invalid_value"
        first = codes
        while isinstance(first, dict | list) and first:
            first = next(iter(first.values())) if isinstance(first, dict) else first[0]
        if first == UNKNOWN_PARAMETER:
            code = UNKNOWN_PARAMETER
        return Problem(status_code, kind, message, param=param, code=code)
    return Problem(status_code, kind, message, code=code)


def routing_headers(routed: RoutingResult) -> dict[str, str]:
    attempts = [a for a in routed.metadata.attempts if a.outcome != "skipped"]
    return {
        "X-Request-ID": routed.request_id,
        "X-LLM-Provider": routed.result.provider,
        "X-LLM-Attempts": str(sum(a.retries + 1 for a in attempts)),
    }


def routed_problem(routed: RoutingResult, viewer: Viewer = NOBODY) -> Problem:
    """A routed request that got no answer: its status, and for an exhausted chain
    every candidate ``viewer`` may see with its outcome and reason."""
    err = routed.result.error
    category = err.category if err else "response"
    status_code, kind = CATEGORY_STATUS.get(category, (503, "unavailable"))
    message = err.message if err else "Every candidate failed."
    extra: dict[str, Any] = {}
    if category == "chain_exhausted":
        candidates = [
            {"provider": a.provider, "outcome": a.outcome, "reason": a.reason}
            for a in routed.metadata.attempts
            if may_see(viewer, "provider", a.provider)
        ]
        reasons = ", ".join(f"{c['provider']}: {c['reason']}" for c in candidates) or "none"
        message = f"No provider could answer (request {routed.request_id}; {reasons})."
        extra = {"request_id": routed.request_id, "candidates": candidates}
    return Problem(status_code, kind, message, code=category, extra=extra)


#: Turns one router event into this face's SSE frames (one instance per stream).
Frames = Callable[[RouterStreamEvent], list[bytes]]


class Face:
    """The translations of one face. Subclasses set ``request_serializer`` and
    implement the four calls; nothing here keeps per-request state."""

    name: ClassVar[str] = ""
    request_serializer: ClassVar[Any] = None

    def parse(self, data: Any) -> Parsed:
        """The validated request, or DRF's ``ValidationError`` naming the field."""
        with reused(self.request_serializer, data) as serializer:  # no per-request deepcopy
            serializer.is_valid(raise_exception=True)
            return Parsed(serializer.to_request(), serializer.echo())

    def body(self, routed: RoutingResult, parsed: Parsed) -> dict[str, Any]:
        """The whole answer (``routed`` served)."""
        raise NotImplementedError

    def frames(self, request_id: str, parsed: Parsed) -> Frames:
        """The SSE frames of a streamed answer, event by event."""
        raise NotImplementedError

    def error_body(self, problem: Problem) -> dict[str, Any]:
        """``problem`` in this face's error envelope."""
        raise NotImplementedError

    def response(self, routed: RoutingResult, parsed: Parsed, viewer: Viewer = NOBODY) -> Response:
        """The whole answer, or the routed error, with the routing headers."""
        if routed.result.status != "ok":
            return self.error_response(routed, viewer)
        return Response(self.body(routed, parsed), headers=routing_headers(routed))

    def error_response(self, routed: RoutingResult, viewer: Viewer = NOBODY) -> Response:
        """The routed error; a 503 names only the candidates ``viewer`` may see."""
        problem = routed_problem(routed, viewer)
        return Response(
            self.error_body(problem), status=problem.status, headers=routing_headers(routed)
        )


def _stream_response(frames: Any, request_id: str, first: RouterStreamEvent) -> HttpResponseBase:
    response: StreamingHttpResponse = sse_response(frames)
    response["X-Request-ID"] = request_id
    if isinstance(first, StreamChunk):
        response["X-LLM-Provider"] = first.provider
    return response


class FaceView(SSENegotiationMixin, RoutingAPIView):
    """A ``/v1`` face: validate → translate → route → translate back, sync (WSGI) and
    async (ASGI) from the same :class:`Face`; every error in the face's envelope."""

    face: ClassVar[Face]
    async_method: ClassVar[str | None] = "post"
    admits_inline = True
    #: Extra authenticators tried after the configured ones (``x-api-key`` on Messages).
    extra_authentication: ClassVar[tuple[str, ...]] = ()

    def get_authenticators(self) -> list[BaseAuthentication]:
        configured = super().get_authenticators()
        if self.extra_authentication and any(
            isinstance(a, TokenAuthentication) for a in configured
        ):  # the same DRF tokens under another header, only where tokens are in use
            configured += [import_string(p)() for p in self.extra_authentication]
        return configured

    def handle_exception(self, exc: Exception) -> Response:
        response: Response = super().handle_exception(exc)
        if isinstance(exc, exceptions.APIException):
            response.data = self.face.error_body(exception_problem(exc, response.status_code))
        return response

    viewer: Viewer = NOBODY  # set by admit: who is asking (access.viewer_for)

    def admit(self, request: Request) -> Parsed:
        parsed = self.face.parse(request.data)
        # What the caller may not use is answered as what does not exist (the same 404
        # as /v1/chat/completions: names cannot be enumerated).
        self.viewer = viewer_for(request.user)
        if not visible_model(parsed.request, self.viewer):
            asked = parsed.request.chain or parsed.request.route or parsed.request.provider
            raise model_not_found(asked or "")
        return Parsed(self.authorize(request, parsed.request), parsed.echo)

    def answer(self, request: Request, admitted: Parsed) -> HttpResponseBase:
        if not admitted.request.stream:
            routed = execute(admitted.request, request_id=current_request_id())
            return self.face.response(routed, admitted, self.viewer)
        request_id = current_request_id() or str(uuid.uuid4())
        events = route_stream(admitted.request, request_id=request_id)
        first = next(events)
        if isinstance(first, StreamResult) and first.routed.result.status != "ok":
            return self.face.error_response(first.routed, self.viewer)  # nothing sent yet
        frames = self.face.frames(request_id, admitted)
        body = (f for event in itertools.chain([first], events) for f in frames(event))
        return _stream_response(body, request_id, first)

    async def aanswer(self, request: Request, admitted: Parsed) -> HttpResponseBase:
        if not admitted.request.stream:
            routed = await aexecute(admitted.request, request_id=current_request_id())
            return self.face.response(routed, admitted, self.viewer)
        request_id = current_request_id() or str(uuid.uuid4())
        events = aroute_stream(admitted.request, request_id=request_id)
        try:
            first = await anext(events)
        except BaseException:  # cancelled (the client went away) or failed: record it now
            await aclose_events(events)
            raise
        if isinstance(first, StreamResult) and first.routed.result.status != "ok":
            await aclose_events(events)
            return self.face.error_response(first.routed, self.viewer)
        frames = self.face.frames(request_id, admitted)

        async def body() -> AsyncIterator[bytes]:
            async with closing_events(events):
                for frame in frames(first):
                    yield frame
                async for event in events:
                    for frame in frames(event):
                        yield frame

        return _stream_response(body(), request_id, first)


#: The errors every face documents: status → (when, an example Problem).
DOCUMENTED_ERRORS: dict[int, tuple[str, Problem]] = {
    400: (
        "A parameter is missing, unknown or invalid (named in the message).",
        Problem(400, "invalid_request", "temperatur: Unknown parameter.", "temperatur"),
    ),
    401: (
        "No credentials, or a wrong token.",
        Problem(401, "authentication", "Invalid token.", code="authentication_failed"),
    ),
    403: (
        "The configured permission classes refuse the caller.",
        Problem(
            403,
            "permission",
            "You do not have permission to perform this action.",
            code="permission_denied",
        ),
    ),
    404: (
        "No chain, route or provider of that name that the caller may use (one they may "
        "not use is answered the same way).",
        Problem(
            404,
            "not_found",
            "The model 'nope' does not exist or you do not have access to it (see GET /v1/models).",
            code="model_not_found",
        ),
    ),
    429: (
        "A throttle or a budget refused the request (Retry-After says when to come back).",
        Problem(
            429,
            "rate_limit",
            "Budget 'team-daily' is exhausted for this day.",
            code="budget_exceeded",
            extra={"budget": "team-daily", "window": "day", "reset_at": "2026-04-01T00:00:00Z"},
        ),
    ),
    502: (
        "The upstream rejected the provider's key or answered unusably.",
        Problem(502, "upstream", "The upstream answered garbage.", code="response"),
    ),
    503: (
        "Every candidate was skipped or failed (each with its reason).",
        Problem(
            503,
            "unavailable",
            "No provider could answer (request 0f8e1c2d-…; claude: unavailable, oc: open_circuit).",
            code="chain_exhausted",
            extra={
                "request_id": "0f8e1c2d-3b4a-5968-7766-554433221100",
                "candidates": [
                    {"provider": "claude", "outcome": "error", "reason": "unavailable"},
                    {"provider": "oc", "outcome": "skipped", "reason": "open_circuit"},
                ],
            },
        ),
    ),
}


def schema_entry(
    face: Face,
    *,
    ok: Any,
    error: Any,
    request_example: Any,
    ok_example: Any,
    codes: tuple[int, ...] = tuple(DOCUMENTED_ERRORS),
) -> dict[str, Any]:
    """``extend_schema`` arguments of a face: the answer's shape, every documented
    error in the face's own envelope, and an example of each (made by the face)."""
    responses: dict[Any, Any] = {200: ok}
    examples = [
        OpenApiExample("A request", value=request_example, request_only=True),
        OpenApiExample("200", value=ok_example, response_only=True, status_codes=["200"]),
    ]
    for code in codes:
        when, problem = DOCUMENTED_ERRORS[code]
        responses[code] = OpenApiResponse(error, when)
        examples.append(
            OpenApiExample(
                str(code),
                value=face.error_body(problem),
                response_only=True,
                status_codes=[str(code)],
            )
        )
    return {"responses": responses, "examples": examples, "tags": ["v1"]}
