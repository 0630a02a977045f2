"""django-llm-routing: resilient LLM provider routing for Django.

``from llm_routing import audit, chat, embed`` is the Python API (``aaudit``, ``achat``
and ``aembed`` are its async twins, for async views and tasks); the HTTP views and the Celery
task call the same functions (:mod:`llm_routing.service`). They are looked up on first
use, so importing the package never imports Django models before the app registry is
ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
    from .service import aaudit, achat, aembed, audit, chat, embed

__all__ = ["__version__", "aaudit", "achat", "aembed", "audit", "chat", "embed"]


def __getattr__(name: str) -> Any:
    if name in {"aaudit", "achat", "aembed", "audit", "chat", "embed"}:
        from . import service

        return getattr(service, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
