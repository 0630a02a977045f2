"""The base of every API view: authentication, permissions and throttles from
``LLM_ROUTING``, the size-limited JSON parser, and the access check that carries the
caller's identity into the router's request, then the caller's budgets (429).

A view that also serves under ASGI as a coroutine (``/audit/``, ``/v1/chat/completions``,
``/health/``) names that method in ``async_method`` and splits its handler in two:
``admit(request)`` (sync: parse, validate, authorize; may read the database) and
``answer(request, admitted)`` / ``aanswer(request, admitted)`` (the sync and the async
way to route and shape the answer). Both faces share DRF's authentication, throttles,
exception handling and rendering, so every status, body and header is the same
(docs/design-decisions.md, "One view, two faces").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, ClassVar, ParamSpec, TypeVar, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.permissions import AllowAny, BasePermission, IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from .. import budgets, seams, snapshot
from ..access import principal_for, refusal, viewer_for
from ..conf import routing_settings
from ..dbconn import on_event_loop
from ..types import AuditRequest, Principal
from .authentication import TokenAuthentication
from .budget_guard import aenforce_budgets, enforce_budgets
from .parsers import LimitedJSONParser
from .throttles import WindowRateThrottle

__all__ = ["RoutingAPIView", "ServerMatchedView", "in_thread", "serve_in_thread"]

P = ParamSpec("P")
R = TypeVar("R")


def in_thread(func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``func`` run in a worker thread, off the event loop (not the one thread Django
    keeps for thread-sensitive code), with Django's connection hygiene before and after
    (as Channels' ``database_sync_to_async``): a connection past ``CONN_MAX_AGE`` or
    broken is closed, so each pool thread holds at most one live connection."""

    @functools.wraps(func)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        close_old_connections()
        try:
            return func(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(run, thread_sensitive=False)


#: The header that carries a prompt-cache affinity key (docs/strategies.md).
AFFINITY_HEADER = "HTTP_X_LLM_AFFINITY"
AFFINITY_MAX_CHARS = 256


def affinity_header(request: Request) -> str | None:
    """The ``X-LLM-Affinity`` header's key (None: absent or blank); a 400 when it is
    longer than :data:`AFFINITY_MAX_CHARS` or holds a control character."""
    value = request.META.get(AFFINITY_HEADER)
    if not value or not value.strip():
        return None
    if len(value) > AFFINITY_MAX_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValidationError(
            {"X-LLM-Affinity": [f"At most {AFFINITY_MAX_CHARS} printable characters."]}
        )
    return str(value)


def _probe() -> None: ...


# The attribute(s) that make a callable a coroutine function for Django (asgiref's
# markcoroutinefunction: ``_is_coroutine`` up to Python 3.11, ``_is_coroutine_mark`` after).
markcoroutinefunction(_probe)
_COROUTINE_MARKS: dict[str, Any] = dict(vars(_probe))


class ServerMatchedView:
    """A URL callback that is a coroutine function to the ASGI handler and a plain
    function to the WSGI one: Django asks ``iscoroutinefunction(view)`` on every request,
    on the event loop under ASGI (``AsyncClient``, uvicorn) and on a plain thread under
    WSGI (``Client``, runserver, gthread). So ASGI gets the async face with no thread
    hop, WSGI the sync face with no event loop per request, from one URL table."""

    def __init__(self, sync_view: Callable[..., Any], async_view: Callable[..., Any]) -> None:
        self.sync_view = sync_view
        self.async_view = async_view
        # view_class, cls, initkwargs, csrf_exempt: what Django, DRF and drf-spectacular read.
        functools.update_wrapper(self, sync_view)

    def __getattr__(self, name: str) -> Any:
        if name in _COROUTINE_MARKS and on_event_loop():
            return _COROUTINE_MARKS[name]
        raise AttributeError(name)

    def __call__(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if on_event_loop():
            return self.async_view(request, *args, **kwargs)
        return self.sync_view(request, *args, **kwargs)


@seams.register(
    "W027",
    "asgiref's coroutine-function marker, answered per call by ServerMatchedView",
    "the API views serve their sync face only (under ASGI Django runs them in a thread)",
)
def _probe_marker() -> str | None:
    if not _COROUTINE_MARKS:
        return "markcoroutinefunction sets no attribute to answer"

    def sync_face(request: HttpRequest) -> None: ...

    view = ServerMatchedView(sync_face, sync_face)

    async def on_a_loop() -> bool:
        return iscoroutinefunction(view)

    # Both questions in a thread of their own: the probe may first run on a server's
    # event loop (a worker builds its URLconf at its first request), where "outside an
    # event loop" would read as inside one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        if pool.submit(iscoroutinefunction, view).result():
            return "the view reads as a coroutine function outside an event loop"
        if not pool.submit(asyncio.run, on_a_loop()).result():
            return "the view does not read as a coroutine function on an event loop"
    return None


async def _plain(response: HttpResponseBase) -> HttpResponseBase:
    """A DRF response rendered here, as a plain HttpResponse: Django would render it in
    its one thread-sensitive thread, serialising every request of the process."""
    if not isinstance(response, Response):
        return response
    if isinstance(getattr(response, "accepted_renderer", None), JSONRenderer):
        response.render()
    else:  # the browsable API renders forms that may read the database
        await in_thread(response.render)()
    plain = HttpResponse(response.content, status=response.status_code)
    for name, value in response.items():
        plain[name] = value
    plain.cookies = response.cookies
    return plain


async def serve_in_thread(
    view: Callable[..., Any], request: HttpRequest, *args: Any, **kwargs: Any
) -> HttpResponseBase:
    """A view's sync face answered from the event loop: run and rendered in a worker
    thread (:func:`in_thread`'s connection hygiene), then as a plain HttpResponse. The
    async face's way to answer a method it has no coroutine for, and the lean lane's
    (llm_routing/lane.py) way to serve a view with no async face."""
    return await _plain(await in_thread(_rendered(view))(request, *args, **kwargs))


class RoutingAPIView(APIView):
    # Authentication, permissions and throttles come from ``LLM_ROUTING`` (read per
    # request, so ``override_settings`` applies). A comment, not a docstring: the
    # OpenAPI page would show a docstring as every endpoint's description.

    parser_classes = [LimitedJSONParser]

    #: The HTTP method also served as a coroutine under ASGI (``admit`` + ``aanswer``).
    async_method: ClassVar[str | None] = None
    #: ``admit`` reads no database row (it validates and reads the config snapshot), so
    #: under ASGI it may run on the event loop when everything else answers from memory.
    admits_inline: ClassVar[bool] = False

    #: Set while ``admit`` runs on the event loop: ``authorize`` leaves the budgets to
    #: :meth:`adispatch` (their async check), and DRF's ``initial`` leaves the throttles.
    _inline = False
    _principal: Principal | None = None

    def get_authenticators(self) -> list[BaseAuthentication]:
        return [import_string(p)() for p in routing_settings.API_AUTHENTICATION_CLASSES]

    def get_permissions(self) -> list[BasePermission]:
        return [import_string(p)() for p in routing_settings.API_PERMISSION_CLASSES]

    def get_throttles(self) -> list[BaseThrottle]:
        return [import_string(p)() for p in routing_settings.API_THROTTLE_CLASSES]

    def authorize(self, request: Request, audit_request: AuditRequest) -> AuditRequest:
        """The request carrying its caller's identity; 403 with the reason for a
        permission the caller lacks, the 404 of a name that does not exist for a chain
        or provider they may not see (:func:`llm_routing.access.refusal`;
        docs/operations.md)."""
        audit_request = replace(
            audit_request,
            principal=principal_for(request.user),
            affinity=audit_request.affinity or affinity_header(request),
        )
        refused = refusal(audit_request, viewer_for(request.user))
        if refused is not None and refused.status == 404:  # a name they may not see
            raise NotFound(refused.message, code=refused.code)
        if refused is not None:
            raise PermissionDenied(refused.message)
        if self._inline:
            self._principal = audit_request.principal  # counted by adispatch, async
        else:
            enforce_budgets(request, audit_request.principal)  # budgets: 429 before the walk
        return audit_request

    def check_throttles(self, request: Request) -> None:
        if not self._inline:  # on the event loop the throttles are awaited instead
            super().check_throttles(request)

    # --- the two faces --------------------------------------------------------------

    def admit(self, request: Request) -> Any:
        """Parse, validate and authorize (sync; may read the database)."""
        raise NotImplementedError

    def answer(self, request: Request, admitted: Any) -> HttpResponseBase:
        """Route and shape the answer, synchronously (WSGI)."""
        raise NotImplementedError

    async def aanswer(self, request: Request, admitted: Any) -> HttpResponseBase:
        """Route and shape the answer on the event loop (ASGI)."""
        raise NotImplementedError

    def handle(self, request: Request) -> HttpResponseBase:
        """The sync handler of ``async_method`` (``post = get = handle``)."""
        return self.answer(request, self.admit(request))

    @classmethod
    def as_view(cls, **initkwargs: Any) -> Any:
        sync_view = super().as_view(**initkwargs)
        if cls.async_method is None or not seams.available("W027"):
            return sync_view

        async def async_view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            if (request.method or "").lower() != cls.async_method:  # OPTIONS, a 405 …
                return await serve_in_thread(sync_view, request, *args, **kwargs)
            self = cls(**initkwargs)
            self.setup(request, *args, **kwargs)
            return await self.adispatch(request, *args, **kwargs)

        return ServerMatchedView(sync_view, async_view)

    async def adispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        """DRF's ``dispatch`` for ``async_method``: authentication, permissions,
        throttles and ``admit`` (on the loop when :meth:`answers_from_memory`, else in
        one worker-thread hop), then ``aanswer`` on the loop; errors through the same
        ``handle_exception`` as the sync face."""
        self.args, self.kwargs = args, kwargs
        drf_request = self.initialize_request(request, *args, **kwargs)
        self.request = drf_request
        self.headers = self.default_response_headers
        try:
            if self.admits_inline and await self.answers_from_memory(drf_request):
                admitted = await self._ainitial_and_admit(drf_request)
            else:
                admitted = await in_thread(self._initial_and_admit)(drf_request)
            response = await self.aanswer(drf_request, admitted)
        except Exception as exc:
            # A request that failed before the router's exit settled it (the
            # configuration read raised) gives its place in flight back here: the end of
            # the HTTP request (``request_finished``) runs in another context under ASGI
            # and does not see the request's grant. A no-op once the exit settled it.
            budgets.forget()
            response = self.handle_exception(exc)
        except BaseException:  # cancelled (the client left) before the exit: the same
            budgets.forget()
            raise
        self.response = self.finalize_response(drf_request, response, *args, **kwargs)  # type: ignore[arg-type]
        return await _plain(self.response)

    def _initial_and_admit(self, request: Request) -> Any:
        self.initial(request, *self.args, **self.kwargs)
        return self.admit(request)

    async def answers_from_memory(self, request: Request) -> bool:
        """Whether authentication, permissions, throttles, ``admit`` and the budgets can
        run on the event loop without a blocking call: the config snapshot is fresh
        (awaited here), the authenticator that answers is a token one answering from
        its cache
        (:meth:`~llm_routing.api.authentication.TokenAuthentication.answers_from_memory`),
        the permissions are DRF's ``IsAuthenticated`` / ``AllowAny`` and the throttles
        are this app's window counters. Otherwise the whole step runs in a worker
        thread, as under WSGI."""
        await snapshot.acurrent()  # fresh for this request: admit reads it with no I/O
        if not _authenticates_from_memory(request):
            return False
        if not all(type(p) in _PURE_PERMISSIONS for p in self.get_permissions()):
            return False
        return all(isinstance(t, WindowRateThrottle) for t in self.get_throttles())

    async def _ainitial_and_admit(self, request: Request) -> Any:
        """:meth:`_initial_and_admit` on the event loop: the same steps in the same
        order (authenticate, permissions, throttles, validate and authorize, budgets),
        the throttles and budgets through their async cache calls."""
        self._inline = True
        try:
            self.initial(request, *self.args, **self.kwargs)  # throttles skipped
            waits = [
                throttle.wait()
                for throttle in self.get_throttles()
                if not await throttle.aallow_request(request, self)  # type: ignore[attr-defined]
            ]
            if waits:
                longest = max((w for w in waits if w is not None), default=None)
                self.throttled(request, cast(float, longest))  # DRF's own passes None too
            user = request.user
            if getattr(user, "is_authenticated", False) and not isinstance(
                getattr(user, "_llm_routing_principal", None), Principal
            ):  # the caller's groups and permissions: read once per cached user object
                await in_thread(principal_for)(user)
            admitted = self.admit(request)
            if self._principal is not None:
                await aenforce_budgets(request, self._principal)
            return admitted
        finally:
            self._inline = False


def _authenticates_from_memory(request: Request) -> bool:
    """DRF asks the authenticators in order until one answers: the one that answers
    must be a token authenticator answering from its cache (no credentials at all:
    anonymous, no query either). Another authenticator reached (the session's reads
    the session) means a worker thread."""
    for authenticator in request.authenticators or ():
        if not isinstance(authenticator, TokenAuthentication):
            return False
        answered = authenticator.answers_from_memory(request)
        if answered is not None:
            return answered
    return True


#: Permission classes that read nothing but the request's user (no query).
_PURE_PERMISSIONS = (IsAuthenticated, AllowAny)


def _rendered(view: Callable[..., Any]) -> Callable[..., Any]:
    def call(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        response = view(request, *args, **kwargs)
        if isinstance(response, Response):
            response.render()
        return response

    return call
