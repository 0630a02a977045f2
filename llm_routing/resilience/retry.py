"""The single retry layer: same-provider retries for transient failures
(the failure policy in docs/architecture.md).

Exponential backoff with full jitter (AWS architecture blog's "full jitter":
``sleep = random(0, min(cap, base * 2**n))``); a ``Retry-After`` the provider sent
is honoured up to ``RETRY_AFTER_CAP_S`` — over the cap there is no same-provider
retry, the router fails over at once. Timeouts are not retried on the same provider.
The sleeper and the random source are injectable so tests never sleep.

:func:`call_with_retries` never raises: every outcome is a ProviderResult whose
``retries`` counts same-provider retries and ``upstream_requests`` the requests sent
(``retries + 1`` for every network adapter that started at least once).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace

from .. import effects
from ..conf import routing_settings
from ..effects import Complete, Sleep, Steps
from ..errors import BudgetExhaustedError, ProviderError, ProviderTimeoutError, ResponseError
from ..logging import known_key_values
from ..providers.base import BaseProvider, read_api_key
from ..types import AuditRequest, ProviderResult, Usage
from .budget import MIN_ATTEMPT_S, Budget

__all__ = [
    "backoff_delay",
    "call_with_retries",
    "deadline_caused",
    "error_result",
    "retry_steps",
]

logger = logging.getLogger("llm_routing.retry")

Sleeper = Callable[[float], None]
Invoke = Callable[[str | None, float], ProviderResult]
#: ``invoke`` for :func:`retry_steps`: a generator function yielding effects.
InvokeSteps = Callable[[str | None, float], Steps[ProviderResult]]


def backoff_delay(retry_number: int, *, rng: Callable[[], float] = random.random) -> float:
    """Full-jitter backoff for the ``retry_number``-th retry (0-based)."""
    cap = float(routing_settings.BACKOFF_MAX_S)
    base = float(routing_settings.BACKOFF_BASE_S)
    return rng() * min(cap, base * (2**retry_number))


def error_result(
    adapter: BaseProvider,
    exc: ProviderError,
    *,
    latency_ms: float,
    retries: int,
    upstream_requests: int,
    secrets: tuple[str | None, ...] = (),
) -> ProviderResult:
    return ProviderResult(
        provider=adapter.config.name,
        model=adapter.config.model,
        mode="error",
        status="error",
        error=exc.to_info(secrets=secrets),
        usage=exc.usage or Usage(),
        latency_ms=latency_ms,
        retries=retries,
        upstream_requests=upstream_requests,
    )


def call_with_retries(
    adapter: BaseProvider,
    request: AuditRequest,
    *,
    budget: Budget,
    sleeper: Sleeper = time.sleep,
    rng: Callable[[], float] = random.random,
    invoke: Invoke | None = None,
    max_retries: int | None = None,
) -> ProviderResult:
    """Call ``adapter.complete`` (or ``invoke(api_key, timeout)``, e.g. opening a stream
    and reading its first chunk) with same-provider retries. ``max_retries`` overrides
    the provider's own (the breaker's half-open probe passes 0). The sync driver over
    :func:`retry_steps`."""
    steps = None if invoke is None else _plain(invoke)
    core = retry_steps(
        adapter, request, budget=budget, rng=rng, invoke=steps, max_retries=max_retries
    )
    return effects.run(core, sleeper=sleeper)


def _plain(invoke: Invoke) -> InvokeSteps:
    """A plain callable as an effect-free step function."""

    def steps(api_key: str | None, timeout: float) -> Steps[ProviderResult]:
        return invoke(api_key, timeout)
        yield  # pragma: no cover - makes this a generator

    return steps


def retry_steps(
    adapter: BaseProvider,
    request: AuditRequest,
    *,
    budget: Budget,
    rng: Callable[[], float] = random.random,
    invoke: InvokeSteps | None = None,
    max_retries: int | None = None,
) -> Steps[ProviderResult]:
    """The retry loop, once for both drivers: yields :class:`~llm_routing.effects.Complete`
    (or whatever ``invoke``'s steps yield) and :class:`~llm_routing.effects.Sleep`;
    returns the ProviderResult, never raises (but lets ClientGone through)."""
    config = adapter.config
    retry_limit = config.max_retries if max_retries is None else max_retries
    if invoke is None:

        def invoke(api_key: str | None, timeout: float) -> Steps[ProviderResult]:
            result = yield from Complete(adapter, request, api_key, timeout)
            return result

    started = time.perf_counter()
    retries = 0
    upstream = 0
    api_key: str | None = None
    # An offline adapter (the mock backstop, mock-mode rows) sends nothing upstream:
    # it neither draws on nor is refused by the request-wide budget, so the backstop
    # still answers when the budget is spent.
    offline = adapter.result_mode == "mock"
    if not offline and not budget.can_start():
        return error_result(
            adapter,
            ProviderTimeoutError("The request-wide deadline or attempt budget was used up."),
            latency_ms=(time.perf_counter() - started) * 1000,
            retries=0,
            upstream_requests=0,
        )
    exc: ProviderError
    while True:
        if not offline:
            budget.take()
            upstream += 1
        api_key = read_api_key(config.api_key_env) if adapter.requires_key else None
        timeout = budget.timeout_for(config.timeout_s)
        try:
            result = yield from invoke(api_key, timeout)
        except ProviderError as err:
            exc = deadline_caused(err, timeout=timeout, own_timeout=config.timeout_s, budget=budget)
        except Exception as err:  # an adapter bug must not escape the router
            logger.exception("Adapter %s (%s) raised %s", config.name, config.kind, type(err))
            exc = ResponseError(f"The adapter failed unexpectedly ({type(err).__name__}).")
        else:
            return replace(
                result,
                retries=retries,
                upstream_requests=upstream,
                latency_ms=(time.perf_counter() - started) * 1000,
            )
        delay = _retry_delay(exc, retries, retry_limit, budget, rng)
        if delay is not None:
            logger.info(
                "Retrying %s after %s (retry %d, sleeping %.3fs)",
                config.name,
                exc.category,
                retries + 1,
                delay,
            )
            yield from Sleep(delay)
            # The wait itself may have used up what was left: then the last error
            # stands and no request is counted that was never sent.
            if offline or budget.can_start():
                retries += 1
                continue
        return error_result(
            adapter,
            exc,
            latency_ms=(time.perf_counter() - started) * 1000,
            retries=retries,
            upstream_requests=upstream,
            secrets=(api_key, *known_key_values()),
        )


def deadline_caused(
    exc: ProviderError, *, timeout: float, own_timeout: float, budget: Budget
) -> ProviderError:
    """A timeout of a call whose timeout the request-wide deadline clamped, once that
    deadline has run out, is the budget's doing, not the provider's: it becomes a
    :class:`BudgetExhaustedError` (recorded as ``budget_exhausted``, never counted on
    the circuit). Any other error is returned unchanged."""
    if (
        isinstance(exc, ProviderTimeoutError)
        and not isinstance(exc, BudgetExhaustedError)
        and timeout < float(own_timeout)
        and budget.remaining() < MIN_ATTEMPT_S
    ):
        return BudgetExhaustedError(
            "The request-wide deadline ran out during this call "
            f"(it had {timeout:.3f}s of its own {float(own_timeout):g}s timeout).",
            http_status=exc.http_status,
        )
    return exc


def _retry_delay(
    exc: ProviderError,
    retries: int,
    max_retries: int,
    budget: Budget,
    rng: Callable[[], float],
) -> float | None:
    """Seconds to wait before retrying the same provider, or None to give up on it."""
    if not exc.retryable or retries >= max_retries:
        return None
    if exc.retry_after is not None:
        if exc.retry_after > float(routing_settings.RETRY_AFTER_CAP_S):
            return None
        delay = max(0.0, exc.retry_after)
    else:
        delay = backoff_delay(retries, rng=rng)
    if not budget.can_wait(delay) or budget.attempts_used >= budget.max_attempts:
        return None
    return delay
