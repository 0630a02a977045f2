"""The Python API behind ``llm_routing.audit`` — shared by the HTTP view and tasks."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError

from .router import route
from .types import AuditRequest, RoutingResult

__all__ = ["audit", "build_request", "execute"]


def build_request(**kwargs: Any) -> AuditRequest:
    """Validate keyword arguments exactly as ``POST /audit/`` validates its body."""
    from .api.serializers import AuditRequestSerializer

    serializer = AuditRequestSerializer(data=kwargs)
    if not serializer.is_valid():
        raise ValidationError(
            {field: [str(e) for e in errors] for field, errors in serializer.errors.items()}
        )
    return serializer.to_request()


def execute(
    request: AuditRequest, *, request_id: str | None = None, persist: bool = True
) -> RoutingResult:
    """Route one already-validated request: the single entry point of the HTTP view,
    the Python API and the Celery task. ``persist=False`` leaves the recording to the
    caller (async jobs record the decision in the transaction that finishes the job)."""
    return route(request, request_id=request_id, persist=persist)


def audit(**kwargs: Any) -> RoutingResult:
    """Validate keyword arguments like ``POST /audit/`` does, then :func:`execute`."""
    return execute(build_request(**kwargs))
