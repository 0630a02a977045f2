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

import logging
from typing import Any

from django.dispatch import Signal

__all__ = [
    "after_provider_result",
    "before_provider_call",
    "config_changed",
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
