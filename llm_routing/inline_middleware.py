"""Django's stock middleware, without a thread hop per request under ASGI.

Under ASGI, Django's ``MiddlewareMixin`` runs every ``process_request`` and
``process_response`` through ``sync_to_async(thread_sensitive=True)``: with the seven
middlewares of a usual project that is up to 14 hops per request, all queued on ONE
shared thread, so every request of a worker waits in that queue (measured on the
routing API: docs/production.md, "ASGI"). These subclasses call the hooks inline on the
event loop, which is safe because they do no I/O there:

* security, common, CSRF, clickjacking, authentication: header and cookie work only
  (``request.user`` stays lazy; the authentication middleware sets it up without
  reading the database; CSRF keeps its secret in a cookie). With
  ``CSRF_USE_SESSIONS = True`` the CSRF secret lives in the session, which its hooks
  read from the database: the CSRF middleware then runs exactly as Django's (its hooks
  in the thread), checked per request;
* messages: inline when the request added or read no message (every API request);
  otherwise its storage may touch the session, and it runs in the thread;
* sessions: ``process_request`` only builds a lazy store; ``process_response`` saves the
  session (a database write) only when the request touched it — then, and only then,
  it runs in the thread as Django's does.

CSRF's ``process_view`` is made a coroutine in async mode too (Django would adapt it
through the same shared thread). Under WSGI every class behaves exactly as its
Django parent.

Two private seams, each behind its guard (:mod:`llm_routing.seams`): overriding
``MiddlewareMixin.__acall__`` (W024: if Django's ``__call__`` stops dispatching to it,
the handler loads Django's stock classes instead) and the message storage's ``used`` /
``added_new`` flags (W025: without them the message middleware's response hook always
runs in the thread, as Django's).

``MIDDLEWARE`` keeps naming Django's classes (its deploy checks look for those exact
paths): :func:`llm_routing.asgi.get_asgi_application` loads these subclasses in their
place (:data:`INLINE`); a project may also name them in ``MIDDLEWARE`` directly.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from asgiref.sync import markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth import middleware as auth
from django.contrib.messages import get_messages
from django.contrib.messages import middleware as messages
from django.contrib.messages.storage.base import BaseStorage
from django.contrib.sessions import middleware as sessions
from django.http import HttpRequest, HttpResponseBase
from django.middleware import clickjacking, common, csrf, security
from django.utils.deprecation import MiddlewareMixin

from . import seams

__all__ = [
    "INLINE",
    "AuthenticationMiddleware",
    "CommonMiddleware",
    "CsrfViewMiddleware",
    "MessageMiddleware",
    "SecurityMiddleware",
    "SessionMiddleware",
    "XFrameOptionsMiddleware",
    "inline_usable",
]


@seams.register(
    "W024",
    "django.utils.deprecation.MiddlewareMixin.__acall__ (overridden to run hooks inline)",
    "the ASGI handler loads Django's stock middleware (a thread hop per hook)",
)
def _probe_acall() -> str | None:
    if not inspect.iscoroutinefunction(getattr(MiddlewareMixin, "__acall__", None)):
        return "MiddlewareMixin has no coroutine __acall__"
    if "self.__acall__(" not in inspect.getsource(MiddlewareMixin.__call__):
        return "MiddlewareMixin.__call__ no longer dispatches to __acall__"
    return None


@seams.register(
    "W025",
    "the messages storage's used / added_new flags",
    "the message middleware's response hook always runs in the thread, as Django's",
)
def _probe_message_flags() -> str | None:
    from django.http import HttpRequest

    storage = BaseStorage(HttpRequest())
    missing = [f for f in ("used", "added_new") if not isinstance(getattr(storage, f, None), bool)]
    return f"BaseStorage has no {', '.join(missing)} flag" if missing else None


def inline_usable() -> bool:
    """Whether the handler may load these subclasses in place of Django's (W024)."""
    return seams.available("W024")


class _Inline:
    """``__acall__`` of ``MiddlewareMixin`` with the hooks called on the loop."""

    get_response: Callable[[HttpRequest], Any]

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response = None
        if not self._inline_now():  # Django's own __acall__: hooks in the thread
            return await super().__acall__(request)  # type: ignore[misc]
        process_request = getattr(self, "process_request", None)
        if process_request is not None:
            response = process_request(request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            response = await self._aprocess_response(request, response)
        return response

    async def _aprocess_response(
        self, request: HttpRequest, response: HttpResponseBase
    ) -> HttpResponseBase:
        process_response = self.process_response  # type: ignore[attr-defined]
        if self._may_do_io(request):  # as Django does it: in the shared thread
            return await sync_to_async(process_response, thread_sensitive=True)(request, response)
        return process_response(request, response)

    def _may_do_io(self, request: HttpRequest) -> bool:
        """Whether this request's ``process_response`` may touch the database."""
        return False

    def _inline_now(self) -> bool:
        """Whether this request's hooks may run on the loop at all."""
        return True


class SecurityMiddleware(_Inline, security.SecurityMiddleware):
    pass


class CommonMiddleware(_Inline, common.CommonMiddleware):
    pass


class XFrameOptionsMiddleware(_Inline, clickjacking.XFrameOptionsMiddleware):
    pass


class MessageMiddleware(_Inline, messages.MessageMiddleware):
    def _may_do_io(self, request: HttpRequest) -> bool:
        # Storing read or added messages may read or write the session.
        if not seams.available("W025"):
            return True
        storage = get_messages(request)  # [] when the request has no storage
        return isinstance(storage, BaseStorage) and bool(storage.used or storage.added_new)


class AuthenticationMiddleware(_Inline, auth.AuthenticationMiddleware):
    pass


class SessionMiddleware(_Inline, sessions.SessionMiddleware):
    def _may_do_io(self, request: HttpRequest) -> bool:
        session = getattr(request, "session", None)  # a touched session may be saved
        return session is not None and bool(session.accessed)


class CsrfViewMiddleware(_Inline, csrf.CsrfViewMiddleware):
    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        super().__init__(get_response)
        if self.async_mode:
            sync_view_hook = self.process_view
            in_thread = sync_to_async(sync_view_hook, thread_sensitive=True)

            async def process_view(
                request: HttpRequest,
                callback: Callable[..., Any],
                callback_args: tuple[Any, ...],
                callback_kwargs: dict[str, Any],
            ) -> HttpResponseBase | None:
                if not self._inline_now():  # the secret is in the session: a query
                    return await in_thread(request, callback, callback_args, callback_kwargs)
                return sync_view_hook(request, callback, callback_args, callback_kwargs)

            self.process_view = markcoroutinefunction(process_view)  # type: ignore[method-assign,assignment]

    def _inline_now(self) -> bool:
        # With CSRF_USE_SESSIONS the secret is read from (and saved to) the session:
        # database work, which Django refuses on the event loop. Read per request.
        return not settings.CSRF_USE_SESSIONS


#: Django's dotted path → the inline subclass loaded in its place under ASGI.
INLINE: dict[str, type] = {
    "django.middleware.security.SecurityMiddleware": SecurityMiddleware,
    "django.contrib.sessions.middleware.SessionMiddleware": SessionMiddleware,
    "django.middleware.common.CommonMiddleware": CommonMiddleware,
    "django.middleware.csrf.CsrfViewMiddleware": CsrfViewMiddleware,
    "django.contrib.auth.middleware.AuthenticationMiddleware": AuthenticationMiddleware,
    "django.contrib.messages.middleware.MessageMiddleware": MessageMiddleware,
    "django.middleware.clickjacking.XFrameOptionsMiddleware": XFrameOptionsMiddleware,
}
