"""Classification of provider failures into the taxonomy of :mod:`llm_routing.errors`.

Three inputs decide the class, in this order:

1. the vendor's own error codes (OpenAI ``error.code`` / ``error.type``, Anthropic
   ``error.type``, Gemini ``error.status`` and ``details[].reason``);
2. the HTTP status (or, for a ``200`` carrying an error body, a numeric ``code`` in
   the body, or a status found in the message text on word boundaries only — "processed
   15000 tokens" is not a 500);
3. well-known phrases of the message (context length, content policy, invalid key).

httpx exceptions map by type (:func:`from_httpx_exception`). ``Retry-After`` is read in
its three forms — delta seconds, HTTP-date and ``retry-after-ms`` — by
:func:`parse_retry_after` and carried on rate-limit / unavailable errors.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from email.utils import parsedate_to_datetime

import httpx

from ..errors import (
    AuthenticationError,
    ContentPolicyError,
    ContextLengthError,
    InvalidRequestError,
    NetworkError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitError,
    ResponseError,
    UnavailableError,
)

__all__ = [
    "UNAVAILABLE_STATUSES",
    "classify_http_error",
    "from_httpx_exception",
    "parse_retry_after",
    "status_in_text",
]

#: HTTP statuses that mean "the provider is unavailable right now" (the failure policy).
UNAVAILABLE_STATUSES = frozenset({500, 502, 503, 504, 529})

_CONTEXT_CODES = frozenset(
    {
        "context_length_exceeded",  # OpenAI, OpenRouter, vLLM
        "context_window_exceeded",
        "string_above_max_length",
        "model_context_window_exceeded",
    }
)
_CONTENT_POLICY_CODES = frozenset(
    {
        "content_policy_violation",  # OpenAI images / moderation
        "content_filter",  # OpenAI finish reason, Azure OpenAI
        "responsibleaipolicyviolation",  # Azure OpenAI
        "safety",  # Gemini finish / block reasons
        "prohibited_content",
        "blocklist",
        "spii",
        "image_safety",
        "refusal",  # Anthropic stop reason
    }
)
_AUTH_CODES = frozenset(
    {
        "authentication_error",  # Anthropic
        "permission_error",
        "invalid_api_key",  # OpenAI
        "incorrect_api_key",
        "unauthenticated",  # Gemini (google.rpc.Code)
        "permission_denied",
        "api_key_invalid",  # Gemini ErrorInfo reason
        "api_key_expired",
    }
)
_RATE_CODES = frozenset(
    {"rate_limit_error", "rate_limit_exceeded", "resource_exhausted", "rate_limited"}
)
#: Rate-limit answers that waiting will not fix (billing): fail over, never retry.
_QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached", "billing_error"})
_UNAVAILABLE_CODES = frozenset(
    {
        "overloaded_error",  # Anthropic 529
        "api_error",  # Anthropic 500
        "server_error",  # OpenAI
        "service_unavailable",
        "unavailable",  # Gemini
        "internal",
        "deadline_exceeded",
        "timeout_error",
    }
)
_INVALID_CODES = frozenset(
    {
        "invalid_request_error",
        "invalid_argument",
        "failed_precondition",
        "not_found_error",
        "not_found",
        "request_too_large",
        "model_not_found",
    }
)

_CONTEXT_RE = re.compile(
    r"context[ _-]?(length|window)|maximum context|prompt is too long|input is too long"
    r"|too many (input )?tokens|exceeds the maximum (number of )?(input )?tokens"
    r"|input token count .* exceeds",
    re.IGNORECASE,
)
_CONTENT_POLICY_RE = re.compile(
    r"content[ _-]?(management )?polic|content[ _-]?filter|safety system|flagged by",
    re.IGNORECASE,
)
_INVALID_KEY_RE = re.compile(
    r"api[ _-]?key (is )?(not valid|invalid|expired)|invalid (x-)?api[ _-]?key"
    r"|incorrect api key",
    re.IGNORECASE,
)
# An HTTP error status in free text, on word boundaries only (never inside 15000, 5.003
# or v1.500.2; a sentence-final "503." counts) and not a count of something ("500 tokens").
_STATUS_RE = re.compile(
    r"(?<![\w.])(4\d\d|5\d\d)(?!\w|\.\w)"
    r"(?!\s*(?:tokens?|characters?|chars?|bytes?|words?|items?|messages?|lines?|"
    r"requests?|seconds?|ms\b|minutes?|pages?|results?|images?)\b)",
    re.IGNORECASE,
)


def status_in_text(text: str) -> int | None:
    """The first 4xx/5xx status named in ``text`` as a whole word, or None."""
    match = _STATUS_RE.search(text or "")
    return int(match.group(1)) if match else None


def parse_retry_after(
    headers: Mapping[str, str] | httpx.Headers, *, now: float | None = None
) -> float | None:
    """Seconds the provider asked us to wait, from ``retry-after-ms`` or ``Retry-After``.

    ``retry-after-ms`` (milliseconds, OpenAI / Azure) wins when present; ``Retry-After``
    is either delta-seconds or an HTTP-date (RFC 9110 §10.2.3). Unparsable or negative
    values are ignored (None); a date in the past means "now" (0.0).
    """
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms:
        try:
            value = float(raw_ms.strip())
        except ValueError:
            value = -1.0
        if value >= 0 and value == value and value != float("inf"):
            return value / 1000.0
    raw = lowered.get("retry-after")
    if not raw:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        pass
    else:
        if seconds >= 0 and seconds == seconds and seconds != float("inf"):
            return seconds
        return None
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def _norm(codes: Iterable[object]) -> set[str]:
    return {str(c).strip().lower() for c in codes if c is not None and str(c).strip()}


def classify_http_error(
    status: int | None,
    *,
    message: str = "",
    codes: Iterable[object] = (),
    retry_after: float | None = None,
) -> ProviderError:
    """One error class for an upstream error answer.

    ``status`` is the HTTP status; for a 200 that carries an error body (or None, when
    there was no HTTP answer) a numeric code among ``codes`` or a status in ``message``
    (word boundaries only) stands in for it when choosing the class.
    """
    found = _norm(codes)
    numeric = [int(c) for c in found if c.isdigit() and 400 <= int(c) <= 599]
    effective = status if status is not None and status >= 400 else None
    if effective is None:
        effective = numeric[0] if numeric else status_in_text(message)
    text = message or ""
    # The status the wire carried (a 200 with an error body stays 200 in the logs).
    kwargs = {"http_status": status if status is not None else effective}
    code = next(iter(sorted(found - {str(n) for n in numeric})), None)

    def make(cls: type[ProviderError], **extra: object) -> ProviderError:
        return cls(text or None, code=code, **kwargs, **extra)  # type: ignore[arg-type]

    # 1. Vendor codes that say exactly what happened.
    if found & _CONTEXT_CODES:
        return make(ContextLengthError)
    if found & _CONTENT_POLICY_CODES:
        return make(ContentPolicyError)
    if found & _AUTH_CODES or effective in (401, 403):
        return make(AuthenticationError)
    if found & _QUOTA_CODES:
        exc = make(RateLimitError)
        exc.retryable = False  # waiting will not refill a quota: fail over at once
        return exc
    if found & _RATE_CODES or effective == 429:
        return make(RateLimitError, retry_after=retry_after)
    if found & _UNAVAILABLE_CODES or (effective is not None and effective >= 500):
        return make(UnavailableError, retry_after=retry_after)
    if effective in (408, 409, 425):
        return make(UnavailableError, retry_after=retry_after)
    # 2. A client error: the message says which one.
    if (effective is not None and 400 <= effective < 500) or found & _INVALID_CODES:
        if _CONTEXT_RE.search(text):
            return make(ContextLengthError)
        if _CONTENT_POLICY_RE.search(text):
            return make(ContentPolicyError)
        if _INVALID_KEY_RE.search(text):
            return make(AuthenticationError)
        return make(InvalidRequestError)
    # 3. An error body we cannot place: the response is not understood.
    return make(ResponseError)


def from_httpx_exception(exc: Exception) -> ProviderError:
    """Map a transport-level httpx failure; the message names the type, never a URL."""
    name = type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        # Connect, read, write or pool timeout: the route is silent, fail over.
        return ProviderTimeoutError(f"The provider did not answer in time ({name}).")
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return InvalidRequestError(f"The provider URL is not usable ({name}).")
    if isinstance(exc, httpx.DecodingError):
        return ResponseError(f"The provider's response could not be decoded ({name}).")
    if isinstance(exc, httpx.TransportError):
        # ConnectError, ReadError/WriteError (reset), RemoteProtocolError (closed early),
        # ProxyError.
        return NetworkError(f"The connection to the provider failed ({name}).")
    return NetworkError(f"The HTTP request failed ({name}).")
