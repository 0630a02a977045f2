"""Routing hooks, sent robustly: a receiver that raises never changes the routing result.

- ``before_provider_call(sender, request_id, provider, model, task)``
- ``after_provider_result(sender, request_id, provider, result)`` (a ProviderResult)
- ``on_provider_fallback(sender, request_id, provider, reason)`` — a candidate was
  skipped or failed and the router moves on.
- ``request_routed(sender, request_id, request, routed)`` — once per routed request
  (streams included, when they end), with the AuditRequest and the RoutingResult;
  metrics, traces and cost read it (docs/observability.md). A receiver must not read
  ``request``'s input text into anything it keeps.

Receivers never get a key; only ``request_routed`` carries the request itself.

- ``config_changed(sender, using)`` — configuration rows changed in bulk (a
  ``QuerySet.update``, ``bulk_create`` or ``bulk_update`` of Provider, Chain,
  ChainEntry or RoutingRule, which send no ``post_save``); the config snapshot listens.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

from django.dispatch import Signal

__all__ = [
    "after_provider_result",
    "asend",
    "before_provider_call",
    "config_changed",
    "defer",
    "deferring",
    "on_provider_fallback",
    "request_routed",
    "send",
]

logger = logging.getLogger("llm_routing.signals")

before_provider_call = Signal()
after_provider_result = Signal()
on_provider_fallback = Signal()
config_changed = Signal()
request_routed = Signal()


def send(signal: Signal, **kwargs: Any) -> None:
    """``send_robust`` and log (without arguments) any receiver that raised."""
    for receiver, response in signal.send_robust(sender=None, **kwargs):
        if isinstance(response, Exception):
            logger.error(
                "Signal receiver %r raised %s; routing continues.",
                getattr(receiver, "__qualname__", receiver),
                type(response).__name__,
            )


#: The tasks receivers started during the current :func:`asend` (None outside one).
_deferred: contextvars.ContextVar[list[asyncio.Task[Any]] | None] = contextvars.ContextVar(
    "llm_routing_signal_deferred", default=None
)


def defer(task: asyncio.Task[Any]) -> None:
    """Called by a receiver that started ``task`` on the event loop instead of doing its
    work inline (the budgets' settlement): the :func:`asend` that called it awaits the
    task before it returns, so the work is never lost to a loop that stops right after
    (``asyncio.run(aaudit(...))``). Outside an ``asend`` the task just runs on."""
    tasks = _deferred.get()
    if tasks is not None:
        tasks.append(task)


def deferring() -> bool:
    """Whether a task handed to :func:`defer` now is awaited (inside an :func:`asend`).
    A receiver sent synchronously on an event loop (:func:`send` from async code) has
    no one to await its task: a task left running may be cancelled with its loop
    (``asyncio.run`` cancels what is left), so such a receiver does its work otherwise."""
    return _deferred.get() is not None


async def asend(signal: Signal, **kwargs: Any) -> None:
    """:func:`send` on the event loop, then await what its receivers :func:`defer`-ed
    (their exceptions are logged, never raised)."""
    token = _deferred.set([])
    try:
        send(signal, **kwargs)
        tasks = _deferred.get() or []
    finally:
        _deferred.reset(token)
    for outcome in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(outcome, Exception):
            logger.error("A deferred signal task raised %s.", type(outcome).__name__)
