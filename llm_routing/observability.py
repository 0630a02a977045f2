"""Connects the metrics and tracing receivers to the routing signals (called from
``LlmRoutingConfig.ready``). Metrics are collected only while
``LLM_ROUTING["METRICS_TOKEN"]`` is set; spans only when opentelemetry-api is
installed (docs/observability.md)."""

from __future__ import annotations

from typing import Any

from .conf import routing_settings
from .signals import request_routed
from .types import AuditRequest, RoutingResult

__all__ = ["connect"]


def _metrics(sender: Any, *, request: AuditRequest, routed: RoutingResult, **_: Any) -> None:
    if not routing_settings.METRICS_TOKEN:
        return
    from . import metrics

    metrics.observe(request, routed)


def connect() -> None:
    from . import tracing

    request_routed.connect(_metrics, dispatch_uid="llm_routing.metrics")
    tracing.connect()
