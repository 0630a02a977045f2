"""The adapter interface.

An adapter turns one :class:`~llm_routing.types.AuditRequest` into one
:class:`~llm_routing.types.ProviderResult`, or raises a
:class:`~llm_routing.errors.ProviderError` subclass. It never touches the database and
never retries: the single retry layer is :mod:`llm_routing.resilience.retry`, and the
router turns whatever escapes into a safe error result.

The key is read from its environment variable at call time by :func:`read_api_key`
and handed to :meth:`BaseProvider.complete`; adapters must not keep it.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar

from django.views.decorators.debug import sensitive_variables

from ..types import (
    AuditRequest,
    ProviderConfig,
    ProviderResult,
    StreamDelta,
    StreamEnd,
    StreamEvent,
)

__all__ = ["CAPABILITIES", "BaseProvider", "read_api_key"]

CAPABILITIES = frozenset({"structured_output", "streaming", "prefill"})


@sensitive_variables("value")
def read_api_key(env_name: str) -> str | None:
    """The key's value, read at call time; ``None`` when unset or empty."""
    if not env_name:
        return None
    value = os.environ.get(env_name)
    return value or None


class BaseProvider(ABC):
    """Base class of every adapter kind."""

    kind: ClassVar[str] = ""
    #: Whether the adapter cannot work without a key (missing → skip ``missing_key``).
    requires_key: ClassVar[bool] = True
    #: Whether this adapter answers with mode "live" (real upstream) or "mock".
    result_mode: ClassVar[str] = "live"

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config

    def supports(self, capability: str) -> bool:
        """Capabilities are declared on the provider row (the model decides them)."""
        return bool(getattr(self.config, f"supports_{capability}", False))

    @abstractmethod
    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        """Call the upstream once. Raise a ProviderError subclass on failure."""

    def stream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> Iterator[StreamEvent]:
        """Yield StreamDelta events, then one StreamEnd; raise a ProviderError on failure.

        ``timeout`` bounds the whole stream; adapters that stream natively also enforce
        ``config.first_token_timeout_s`` before the first delta and an idle timeout
        between events. This default answers in one piece through :meth:`complete`.
        """
        result = self.complete(request, api_key=api_key, timeout=timeout)
        if result.output:
            yield StreamDelta(result.output)
        yield StreamEnd(finish_reason=result.finish_reason, usage=result.usage, model=result.model)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release pooled resources (HTTP clients)."""
