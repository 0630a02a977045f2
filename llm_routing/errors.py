"""Failure taxonomy: every provider failure becomes one of these (the failure policy
in docs/architecture.md).

The tree::

    ProviderError                   category        transient  same-provider retry
                                    (the policy columns: llm_routing.failure_policy)
    ├── TransientError
    │   ├── RateLimitError          rate_limit      yes        yes (Retry-After <= cap)
    │   ├── UnavailableError        unavailable     yes        yes (backoff, full jitter)
    │   ├── NetworkError            network         yes        yes
    │   └── ProviderTimeoutError    timeout         yes        no  (silent route: fail over)
    │       └── BudgetExhaustedError budget_exhausted yes     no  (never counts on a circuit)
    └── PermanentError
        ├── ContextLengthError      context_length  no         no  (next candidate is tried)
        ├── AuthenticationError     authentication  no         no  (the walk stops)
        ├── InvalidRequestError     invalid_request no         no  (the walk stops)
        ├── ContentPolicyError      content_policy  no         no  (the walk stops)
        └── ResponseError           response        no         no  (the walk stops)
            └── ClientDisconnectedError client_disconnected      (never fed to a circuit)

Each class carries ``category`` and ``http_status`` as its contract (like DRF's
``status_code`` / ``default_code``), and the failure policy of its category, set on
the class from :func:`llm_routing.failure_policy.policy_for` (the only place it is
decided): ``transient``; ``advances`` (the router moves on to the next candidate);
``retryable`` (the retry layer may try the same provider again);
``counts_toward_circuit`` (it counts toward opening the circuit); ``observed`` (the
circuit sees it at all). :meth:`ProviderError.to_info` carries the policy on the
ErrorInfo; the retry layer, the router and the breaker read it there.

Messages are built from vendor error bodies and may echo what was sent, so every
message is scrubbed of known key values (:func:`scrub`) before it is stored.
Classification of HTTP responses and httpx exceptions lives in
:mod:`llm_routing.providers.classify`.
"""

from __future__ import annotations

from collections.abc import Iterable

from .failure_policy import policy_for
from .types import ErrorInfo, Usage

__all__ = [
    "AuthenticationError",
    "BudgetExhaustedError",
    "ClientDisconnectedError",
    "ContentPolicyError",
    "ContextLengthError",
    "InvalidRequestError",
    "NetworkError",
    "PermanentError",
    "ProviderError",
    "ProviderTimeoutError",
    "RateLimitError",
    "ResponseError",
    "TransientError",
    "UnavailableError",
    "scrub",
]

REDACTED = "[redacted]"


def scrub(text: str, secrets: Iterable[str | None]) -> str:
    """Replace every occurrence of each secret value in ``text`` (redact by value)."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text


class ProviderError(Exception):
    """The failure policy is the class's, from its ``category``'s row of
    :func:`~llm_routing.failure_policy.policy_for` (set by :meth:`__init_subclass__`;
    an instance may tighten ``retryable``): ``advances`` (the walk moves on),
    ``retryable`` (the retry layer may try the same provider again),
    ``counts_toward_circuit`` and ``observed`` (fed to the circuit at all).
    :meth:`to_info` carries it to the router and the breaker, which read it."""

    category: str = "response"
    transient: bool
    retryable: bool
    advances: bool
    counts_toward_circuit: bool
    observed: bool
    default_message: str = "The provider failed."

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        _take_policy(cls)

    def __init__(
        self,
        message: str | None = None,
        *,
        http_status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.message = message or self.default_message
        self.http_status = http_status
        self.code = code
        self.retry_after = retry_after
        # Tokens the upstream reported although the answer failed (it is charged).
        self.usage: Usage | None = None
        super().__init__(self.message)

    def to_info(self, *, secrets: Iterable[str | None] = ()) -> ErrorInfo:
        return ErrorInfo(
            category=self.category,
            message=scrub(self.message, secrets)[:500],
            http_status=self.http_status,
            transient=self.transient,
            retry_after_s=self.retry_after,
            advances=self.advances,
            counts=self.counts_toward_circuit,
            observed=self.observed,
        )


#: ProviderError's policy attributes -> the Policy field each is read from.
_POLICY_ATTRIBUTES = {
    "transient": "transient",
    "retryable": "retryable",
    "advances": "advances",
    "counts_toward_circuit": "counts",
    "observed": "observed",
}


def _take_policy(cls: type[ProviderError]) -> None:
    """Set ``cls``'s failure policy from its category's row of the table (a class of
    a custom adapter that sets one of them in its own body keeps its own)."""
    policy = policy_for(cls.category)
    for attribute, field in _POLICY_ATTRIBUTES.items():
        if attribute not in cls.__dict__:
            setattr(cls, attribute, getattr(policy, field))


_take_policy(ProviderError)


class TransientError(ProviderError):
    """Transient failures (the policy table says which kinds are)."""


class RateLimitError(TransientError):
    category = "rate_limit"
    default_message = "The provider rate-limited the request."


class UnavailableError(TransientError):
    category = "unavailable"
    default_message = "The provider is unavailable."


class NetworkError(TransientError):
    category = "network"
    default_message = "Could not reach the provider."


class ProviderTimeoutError(TransientError):
    category = "timeout"
    default_message = "The provider did not answer in time."


class BudgetExhaustedError(ProviderTimeoutError):
    """A timeout that only the request-wide deadline caused: the call's own timeout was
    clamped to what the deadline left, and the deadline ran out. The provider was not
    slow by its own measure, so this never counts toward its circuit."""

    category = "budget_exhausted"
    default_message = "The request-wide deadline ran out during this call."


class PermanentError(ProviderError):
    """Permanent failures (the policy table says which kinds are)."""


class ContextLengthError(PermanentError):
    category = "context_length"
    default_message = "The input is longer than this model's context window."


class AuthenticationError(PermanentError):
    category = "authentication"
    default_message = "The provider rejected the credentials."


class InvalidRequestError(PermanentError):
    category = "invalid_request"
    default_message = "The provider rejected the request as invalid."


class ContentPolicyError(PermanentError):
    category = "content_policy"
    default_message = "The provider refused the request under its content policy."


class ResponseError(PermanentError):
    category = "response"
    default_message = "The provider's response could not be understood."


class ClientDisconnectedError(ResponseError):
    """The client went away before its answer was complete: says nothing of the
    provider's health (never fed to its circuit)."""

    category = "client_disconnected"
    default_message = "The client went away mid-stream."
