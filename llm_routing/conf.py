"""The ``LLM_ROUTING`` settings dict: defaults, validation and cached access.

Modelled on ``rest_framework.settings``: one dict of :data:`DEFAULTS`, a lazy object
that rejects unknown keys, caches what it read, and is reset on Django's
``setting_changed`` signal so ``override_settings(LLM_ROUTING=...)`` works in tests.

Usage::

    from llm_routing.conf import routing_settings
    routing_settings.MAX_INPUT_CHARS

The app never reads ``django.conf.settings.LLM_ROUTING`` anywhere else and never
writes into ``django.conf.settings``. Every key is documented in
``docs/configuration.md``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

__all__ = ["DEFAULTS", "RoutingSettings", "routing_settings"]

DEFAULTS: dict[str, Any] = {
    # --- input caps (POST /audit/, the Python API) -------------------------------
    "MAX_INPUT_CHARS": 100_000,
    "MAX_INSTRUCTIONS_CHARS": 20_000,
    "MAX_TASK_CHARS": 64,
    "MAX_METADATA_KEYS": 32,
    "MAX_METADATA_KEY_CHARS": 64,
    "MAX_METADATA_VALUE_CHARS": 512,
    "MAX_SCHEMA_BYTES": 32_768,
    # Chat requests (``messages`` on /audit/, /v1 and llm_routing.chat): most turns in
    # one conversation, and most tool definitions in one request.
    "MAX_MESSAGES": 256,
    "MAX_TOOLS": 128,
    # Request bodies larger than this are refused with 413 before they are parsed.
    "MAX_REQUEST_BYTES": 1_048_576,
    # JSON nested deeper than this is refused with 400 (never a RecursionError/500).
    "MAX_JSON_DEPTH": 32,
    # --- output ceilings (issue 11) ---------------------------------------------------
    # Largest max_tokens any upstream is sent: a client's or a row's larger value is
    # clamped to it (None: only the rows' params.max_tokens are ceilings).
    "MAX_OUTPUT_TOKENS": 32_768,
    # A client's max_tokens / max_completion_tokens above this is refused with 400.
    "MAX_OUTPUT_TOKENS_LIMIT": 1_048_576,
    # Most tokens an upstream may report for one count of one answer (input or output):
    # a larger count is counted as this, with a warning (llm_routing.providers.usage).
    "MAX_REPORTED_TOKENS": 10_000_000,
    # --- routing -------------------------------------------------------------------
    # Provider names used when the database has no default chain.
    "DEFAULT_CHAIN": [],
    # Route key -> list of provider names, used when no RoutingRule matches the route.
    "ROUTES": {},
    # Model name reported by the built-in mock backstop.
    "MOCK_MODEL": "mock-1",
    # Largest structured answer the mock generates from a response schema (bytes of
    # JSON) and deepest it descends; a schema past either bound is refused with 400.
    "MOCK_MAX_OUTPUT_BYTES": 262_144,
    "MOCK_MAX_DEPTH": 16,
    # Extra adapter kinds: {"kind": "dotted.path.AdapterClass"}.
    "PROVIDER_KINDS": {},
    # Environment variable names that may never be used as api_key_env (added to the
    # built-in deny-list in llm_routing.validators).
    "DENIED_KEY_ENV_NAMES": [],
    # --- resilience (the failure policy) ---------------------------------------------
    # Wall-clock budget for one routed request, retries and candidates included.
    "REQUEST_DEADLINE_S": 60.0,
    # Upstream requests allowed for one routed request, retries and candidates included.
    "MAX_ATTEMPTS": 6,
    "BACKOFF_BASE_S": 0.25,
    "BACKOFF_MAX_S": 4.0,
    # A Retry-After longer than this is not waited for on the same provider.
    "RETRY_AFTER_CAP_S": 5.0,
    # Longest wait for a TCP/TLS connection to a provider (also capped by the row's
    # first_token_timeout_s and by the request-wide deadline).
    "CONNECT_TIMEOUT_S": 5.0,
    # Largest upstream response body read, in bytes.
    "MAX_RESPONSE_BYTES": 4_194_304,
    # Connection pool of each provider's HTTP client (sync, and async per event loop):
    # at most this many connections open at once, and this many kept idle for reuse.
    "HTTP_MAX_CONNECTIONS": 1000,
    "HTTP_MAX_KEEPALIVE": 100,
    # The async upstream client's transport: "aiohttp" (httpx over aiohttp's connection
    # pool and C parser, the httpx-aiohttp package) or "httpx" (httpcore). The sync
    # client is httpcore's either way (llm_routing.providers.aio).
    "ASYNC_HTTP_TRANSPORT": "aiohttp",
    # Django cache alias holding circuit state (shared when it is Redis).
    "CACHE_ALIAS": "default",
    # The Redis of the app's shared state (circuits, throttles, budgets, the config
    # version key): "redis://", "rediss://" or "unix://" URL. None: the CACHE_ALIAS
    # cache's LOCATION and OPTIONS when its backend is Django's RedisCache.
    "REDIS_URL": None,
    # --- circuit breaker (issue 4) — docs/circuit-breakers.md --------------------------
    # Consecutive transient failures (calls after retries) that open a circuit.
    "BREAKER_FAILURE_THRESHOLD": 3,
    # Cooldown ladder in seconds: the n-th opening in a streak waits the n-th step (the
    # last step repeats), never longer than BREAKER_COOLDOWN_MAX_S.
    "BREAKER_COOLDOWNS_S": [1.0, 2.0, 5.0, 10.0],
    "BREAKER_COOLDOWN_MAX_S": 10.0,
    # A streak ends (ladder and failure count back to zero) after this long without a
    # counted failure.
    "BREAKER_RESET_AFTER_S": 60.0,
    # A 429 whose Retry-After exceeds RETRY_AFTER_CAP_S opens the circuit for that long,
    # but never longer than this.
    "BREAKER_RETRY_AFTER_MAX_S": 300.0,
    # Lifetime of the single half-open probe slot (at least the provider's timeout_s + 1).
    "BREAKER_PROBE_TTL_S": 10.0,
    # --- streaming (issue 5) ---------------------------------------------------------
    # Longest silence between two stream events once the first token has arrived
    # (before it, the row's first_token_timeout_s applies); always inside the call's
    # overall timeout and the request-wide deadline.
    "STREAM_IDLE_TIMEOUT_S": 30.0,
    # --- HTTP API --------------------------------------------------------------------
    "API_AUTHENTICATION_CLASSES": [
        "llm_routing.api.authentication.TokenAuthentication",
        "llm_routing.api.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "API_THROTTLE_CLASSES": [
        "llm_routing.api.throttles.AuditUserThrottle",
        "llm_routing.api.throttles.AuditAnonThrottle",
    ],
    # DRF rate strings ("120/min"); None disables that throttle.
    "API_THROTTLE_RATES": {"user": "120/min", "anon": "10/min"},
    # --- decision spool (issue 11) --------------------------------------------------------
    # Directory where routing decisions the database refused are appended as JSON lines
    # (manage.py llm_routing_spool_flush writes them later). None: not kept, only logged.
    "SPOOL_DIR": None,
    # --- recording (issue 14) ----------------------------------------------------------
    # "inline": the sync router writes the decision before it returns; "write_behind":
    # it queues it for a background writer (the async path always does).
    "RECORD_MODE": "inline",
    # Bound of the write-behind queue (records); a record past it is spooled.
    "RECORD_QUEUE_SIZE": 10_000,
    # --- retention --------------------------------------------------------------------
    "RETENTION_DAYS": 30,
    # --- jobs and retention (issue 6) ---------------------------------------------------
    # Rows deleted per transaction by the retention purge (task and management command).
    "RETENTION_BATCH_SIZE": 1000,
    # A running async job is re-claimable once REQUEST_DEADLINE_S + this has passed
    # since its claim (its worker is then presumed dead).
    "JOB_LEASE_GRACE_S": 30.0,
    # Claims of one async job before it is marked failed (poison-message guard).
    "JOB_MAX_CLAIMS": 3,
    # --- observability (issue 15) -------------------------------------------------------
    # Bearer token that GET /metrics requires; None: /metrics answers 404 and no metric
    # is collected (docs/observability.md).
    "METRICS_TOKEN": None,
}


class RoutingSettings:
    """Attribute access to ``settings.LLM_ROUTING`` merged over :data:`DEFAULTS`."""

    def __init__(self, user_settings: dict[str, Any] | None = None) -> None:
        self._explicit = user_settings
        self._cache: dict[str, Any] = {}

    @property
    def user_settings(self) -> dict[str, Any]:
        if self._explicit is not None:
            return self._explicit
        value = getattr(settings, "LLM_ROUTING", {}) or {}
        if not isinstance(value, dict):
            raise ImproperlyConfigured(
                f"settings.LLM_ROUTING must be a dict, not {type(value).__name__}."
            )
        return value

    def unknown_keys(self) -> list[str]:
        return sorted(set(self.user_settings) - set(DEFAULTS))

    def validate(self) -> None:
        """Raise ImproperlyConfigured naming every unknown key."""
        unknown = self.unknown_keys()
        if unknown:
            raise ImproperlyConfigured(
                "Unknown LLM_ROUTING setting(s): "
                + ", ".join(unknown)
                + ". Valid keys are listed in docs/configuration.md."
            )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in DEFAULTS:
            raise AttributeError(f"Invalid LLM_ROUTING setting: {name!r}")
        if name in self._cache:
            return self._cache[name]
        self.validate()
        value = self.user_settings.get(name, DEFAULTS[name])
        self._cache[name] = value
        return value

    def reload(self) -> None:
        self._cache.clear()


routing_settings = RoutingSettings()


@receiver(setting_changed)
def _reload_routing_settings(*, setting: str, **kwargs: Any) -> None:
    if setting == "LLM_ROUTING":
        routing_settings.reload()
