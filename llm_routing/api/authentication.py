"""DRF token authentication with the token → user lookup cached briefly in process.

``Authorization: Token <key>`` (:class:`TokenAuthentication`), ``Authorization:
Bearer <key>`` (:class:`BearerTokenAuthentication`, what OpenAI clients send) and, on
``/v1/messages``, ``x-api-key: <key>`` (:class:`ApiKeyHeaderAuthentication`, what the
Anthropic SDK sends) use the same DRF tokens. A looked-up token is kept in this process
for :data:`TOKEN_CACHE_TTL_S` (5 s), so a request normally costs no query for
authentication (and, through the cached user, none for the caller's groups and
permissions either).

Staleness (docs/production.md, "Caches and their staleness"): in the process where the
change is made, deleting a token, saving a user, or changing a user's groups or
permissions (or a group's permissions) empties the cache at once; in every other
process a revoked token, a deactivated user or a removed permission stays in effect up
to 5 s.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models.signals import m2m_changed, post_delete, post_save
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

__all__ = [
    "TOKEN_CACHE_MAX_ENTRIES",
    "TOKEN_CACHE_TTL_S",
    "ApiKeyHeaderAuthentication",
    "BearerTokenAuthentication",
    "TokenAuthentication",
    "clear_token_cache",
]

#: How long a looked-up token is trusted without asking the database.
TOKEN_CACHE_TTL_S = 5.0
#: At most this many tokens are kept (the cache is emptied when it is full).
TOKEN_CACHE_MAX_ENTRIES = 10_000

_clock = time.monotonic  # a fake clock in tests
_lock = threading.Lock()
_cache: dict[str, tuple[float, Any, Any]] = {}  # key -> (expires at, user, token)
_connected = False


def clear_token_cache(**_: Any) -> None:
    """Forget every cached token (signal receivers; tests)."""
    with _lock:
        _cache.clear()


class TokenAuthentication(authentication.TokenAuthentication):
    """DRF's ``TokenAuthentication`` whose lookup is cached for ``TOKEN_CACHE_TTL_S``."""

    #: What :meth:`answers_from_memory` found cached and fresh (key, user, token): the
    #: answer :meth:`authenticate_credentials` gives for that key, even if the entry
    #: expires in between — on the event loop a lookup then would be a database query
    #: there (``SynchronousOnlyOperation``, a 500). DRF builds the authenticators per
    #: request.
    _pinned: tuple[str, Any, Any] | None = None

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        if not _connected:
            _connect(self.get_model())
        if self._pinned is not None and self._pinned[0] == key:
            return self._pinned[1], self._pinned[2]
        now = _clock()
        hit = _cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1], hit[2]
        user, token = super().authenticate_credentials(key)
        with _lock:
            if len(_cache) >= TOKEN_CACHE_MAX_ENTRIES:
                _cache.clear()
            _cache[key] = (now + TOKEN_CACHE_TTL_S, user, token)
        return user, token

    def answers_from_memory(self, request: Any) -> bool | None:
        """Whether :meth:`authenticate` answers ``request`` without the database: True
        for malformed credentials of this scheme (DRF's 401) or a key cached and fresh,
        False for a key it would look up, None when the request carries no credentials
        of this scheme (DRF asks the next authenticator). The async views authenticate
        on the event loop when the answering authenticator answers from memory."""
        auth = authentication.get_authorization_header(request).split()
        if not auth or auth[0].lower() != self.keyword.lower().encode():
            return None
        if len(auth) != 2:
            return True
        try:
            key = auth[1].decode()
        except UnicodeError:
            return True
        return self._pin(key)

    def _pin(self, key: str) -> bool:
        """Whether ``key``'s entry is cached and fresh; if so it is this request's
        answer (:attr:`_pinned`)."""
        hit = _cache.get(key)
        if not (_connected and hit is not None and hit[0] > _clock()):
            return False
        self._pinned = (key, hit[1], hit[2])
        return True


class BearerTokenAuthentication(TokenAuthentication):
    keyword = "Bearer"


class ApiKeyHeaderAuthentication(TokenAuthentication):
    """The same DRF tokens in the ``x-api-key`` header (what the Anthropic SDK sends).
    ``/v1/messages`` adds it after the configured authenticators when those use tokens."""

    header = "HTTP_X_API_KEY"

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        key = request.META.get(self.header)
        if not key:
            return None
        if not isinstance(key, str) or " " in key.strip():
            raise exceptions.AuthenticationFailed("Invalid x-api-key header.")
        return self.authenticate_credentials(key.strip())

    def authenticate_header(self, request: Any) -> str:
        return "x-api-key"

    def answers_from_memory(self, request: Any) -> bool | None:
        key = request.META.get(self.header)
        if not key:
            return None
        return self._pin(str(key).strip())


def _on_token_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    with _lock:
        _cache.pop(str(instance.key), None)


def _connect(token_model: Any) -> None:
    """Wire the invalidation receivers (once, at the first lookup: the token app is
    only required by hosts that use token authentication)."""
    global _connected
    user_model = get_user_model()
    post_delete.connect(_on_token_deleted, sender=token_model, dispatch_uid="llmr-token-del")
    post_save.connect(clear_token_cache, sender=token_model, dispatch_uid="llmr-token-save")
    post_save.connect(clear_token_cache, sender=user_model, dispatch_uid="llmr-token-user")
    post_delete.connect(clear_token_cache, sender=user_model, dispatch_uid="llmr-token-user-del")
    throughs = [Group.permissions.through]
    for name in ("groups", "user_permissions"):  # a custom user model may lack them
        if (related := getattr(user_model, name, None)) is not None:
            throughs.append(related.through)
    for through in throughs:
        m2m_changed.connect(clear_token_cache, sender=through, dispatch_uid=f"llmr-token-{through}")
    _connected = True


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "llm_routing.api.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "The same DRF token."}


class ApiKeyHeaderScheme(OpenApiAuthenticationExtension):
    target_class = "llm_routing.api.authentication.ApiKeyHeaderAuthentication"
    name = "apiKeyHeader"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "x-api-key",
            "description": "The same DRF token (Anthropic clients; /v1/messages only).",
        }
