"""django-llm-routing: resilient LLM provider routing for Django.

``from llm_routing import audit`` is the Python API; the HTTP view and the Celery task
call the same function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import RoutingResult

__all__ = ["audit"]
__version__ = "0.1.0"


def audit(**kwargs: Any) -> RoutingResult:
    """Route one request; keyword arguments mirror the fields of ``POST /audit/``.

    Required: ``task`` and ``input_text``. Optional: ``instructions``, ``provider``,
    ``route``, ``force_provider``, ``response_schema``, ``metadata``. Inputs are
    validated exactly as the HTTP API validates them; bad input raises
    ``django.core.exceptions.ValidationError`` naming the field.
    """
    from .service import audit as _audit

    return _audit(**kwargs)
