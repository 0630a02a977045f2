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

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string
from drf_spectacular.utils import OpenApiExample, OpenApiResponse
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request
from rest_framework.response import Response

from ..access import NOBODY, Viewer, viewer_for
from ..logging import current_request_id
from ..router import aroute_stream, route_stream
from ..service import aexecute, execute
from ..types import (
    AuditRequest,
    RouterStreamEvent,
    RoutingResult,
    StreamChunk,
    StreamFailure,
    StreamResult,
)
from .authentication import TokenAuthentication
from .base import RoutingAPIView
from .openai_compat import model_not_found, select_model, visible_model
from .problems import Problem, exception_problem, flatten, routed_problem, routing_headers
from .reuse import reused
from .sse import (
    EventFrames,
    SSENegotiationMixin,
    aclose_events,
    aevent_frames,
    afirst_event,
    routed_stream_response,
)

__all__ = [
    "Face",
    "FaceView",
    "Frames",
    "Parsed",
    "Problem",
    "StreamEvents",
    "exception_problem",
    "flatten",
    "routed_problem",
    "routing_headers",
    "schema_entry",
    "select_model",
]


@dataclass(frozen=True, slots=True)
class Parsed:
    """A validated request: the router's request and what the answer echoes back."""

    request: AuditRequest
    echo: Mapping[str, Any] = field(default_factory=dict)


#: Turns one router event into this face's SSE frames (one instance per stream).
Frames = Callable[[RouterStreamEvent], list[bytes]]


class StreamEvents:
    """A face's SSE events of one streamed answer, router event by router event: the
    walk every face shares (started once, text and tool-call deltas, the answer whole
    when nothing of it was streamed, the open block closed, then the end), each step's
    frames said by the face. One instance per stream (a :data:`Frames`)."""

    #: Whether an answer with no text and no tool call is sent as an (empty) text.
    empty_text: ClassVar[bool] = False

    text_sent = False
    calls_sent = False

    def _start(self, model: str) -> list[bytes]:
        """The opening frames (once: ``[]`` after the first call)."""
        raise NotImplementedError

    def _text(self, text: str) -> list[bytes]:
        raise NotImplementedError

    def _call(self, index: int, call_id: str, name: str, arguments: str) -> list[bytes]:
        raise NotImplementedError

    def _close(self) -> list[bytes]:
        """The frames that close the open block, if any."""
        raise NotImplementedError

    def _finish(self, routed: RoutingResult) -> list[bytes]:
        """The frames after the last block of a served answer."""
        raise NotImplementedError

    def _failure(self, event: StreamFailure) -> list[bytes]:
        """The in-band error of a failure after the commit point."""
        raise NotImplementedError

    def __call__(self, event: RouterStreamEvent) -> list[bytes]:
        if isinstance(event, StreamChunk):
            out = self._start(event.model)
            if event.tool_call is not None:
                d = event.tool_call
                return out + self._call(d.index, d.id or "", d.name or "", d.arguments)
            return out + (self._text(event.text) if event.text else [])
        if isinstance(event, StreamResult):
            result = event.routed.result
            out = self._start(result.model)
            if (
                not self.text_sent
                and not self.calls_sent
                and (result.output or (self.empty_text and not result.tool_calls))
            ):
                out += self._text(result.output)  # nothing streamed: the answer whole
            if result.tool_calls and not self.calls_sent:
                for i, call in enumerate(result.tool_calls):
                    out += self._call(i, call.id, call.name, call.arguments)
            out += self._close()
            return out + self._finish(event.routed)
        return self._failure(event)


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
            self.error_body(problem), status=problem.status, headers=routing_headers(routed, viewer)
        )


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
        body = EventFrames(events, frames, head=(first,))  # closed with the response
        return routed_stream_response(body, request_id, first)

    async def aanswer(self, request: Request, admitted: Parsed) -> HttpResponseBase:
        if not admitted.request.stream:
            routed = await aexecute(admitted.request, request_id=current_request_id())
            return self.face.response(routed, admitted, self.viewer)
        request_id = current_request_id() or str(uuid.uuid4())
        events = aroute_stream(admitted.request, request_id=request_id)
        first = await afirst_event(events)
        if isinstance(first, StreamResult) and first.routed.result.status != "ok":
            await aclose_events(events)
            return self.face.error_response(first.routed, self.viewer)
        frames = self.face.frames(request_id, admitted)
        return routed_stream_response(aevent_frames(events, frames, (first,)), request_id, first)


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
