"""Guards for the few private seams of Django, asgiref, DRF and httpcore this app uses.

A seam is a place where the app relies on something its framework does not promise: a
private attribute, a method it overrides, a copied function. Each seam is declared
here, beside a probe that checks, once per process, that what it relies on is still
there and still means what it meant. When a probe fails, the code at that seam takes
Django's (or the library's) own way instead, and the system check
:func:`llm_routing.checks.check_private_seams` reports a warning naming the seam
(``llm_routing.W020`` ... ``W028``, docs/configuration.md). An upgrade that moves one
of them costs speed, never correctness, and says so at start-up.

=========  ====================================================================
id         seam (where it is used; the fallback)
=========  ====================================================================
W020       Django 5.2's ``ASGIHandler.handle``, copied (asgi.py; Django's own handle)
W021       asgiref's ``SyncToAsync.thread_sensitive_context`` /
           ``context_to_thread_executor`` (asgi.py; the request's end in a thread)
W022       ``Signal._live_receivers`` (asgi.py; signals sent through a thread)
W023       ``django.core.handlers.base.import_string``, swapped while the handler
           loads its middleware (asgi.py; Django's stock middleware)
W024       ``MiddlewareMixin.__acall__``, overridden (inline_middleware.py; stock)
W025       the messages storage's ``used`` / ``added_new`` (inline_middleware.py;
           the message middleware's response hook in a thread)
W026       what DRF caches on a serializer instance (api/reuse.py; a new
           serializer per request)
W027       asgiref's coroutine marker answered per call (api/base.py; the sync view
           only: Django runs it in a thread under ASGI)
W028       httpcore reading the ``timeout`` extension when a body read starts
           (providers/base.py; the body's read timeout set before sending)
=========  ====================================================================

Tests simulate each drift (monkeypatch the attribute away, then :func:`reset`) and
see the fallback and the warning (tests/test_seams.py).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Seam", "available", "broken", "register", "reset", "seams"]

logger = logging.getLogger("llm_routing.seams")


@dataclass(frozen=True)
class Seam:
    """One private seam: its check id, what it relies on, and the fallback."""

    code: str
    relies_on: str
    fallback: str
    #: None when the seam is usable, else why not (said in the system check).
    probe: Callable[[], str | None]


_registry: dict[str, Seam] = {}
_lock = threading.Lock()


def register(code: str, relies_on: str, fallback: str) -> Callable[..., Callable[[], str | None]]:
    """Declare a seam; decorates its probe (a function returning None when usable,
    else the reason it is not)."""

    def decorate(probe: Callable[[], str | None]) -> Callable[[], str | None]:
        _registry[code] = Seam(code, relies_on, fallback, probe)
        return probe

    return decorate


@functools.cache
def broken(code: str) -> str | None:
    """Why the seam ``code`` may not be used in this process (None: it may). Probed
    once; a failing probe is logged once as a warning, and reported by the system
    check."""
    _load()
    seam = _registry[code]
    try:
        reason = seam.probe()
    except Exception as exc:  # a probe that cannot even run: the seam moved
        reason = f"its probe failed ({type(exc).__name__}: {exc})"
    if reason is not None:
        logger.warning(
            "llm_routing: %s is not usable (%s); %s.", seam.relies_on, reason, seam.fallback
        )
    return reason


def available(code: str) -> bool:
    """Whether the seam ``code`` may be used (see :func:`broken`)."""
    return broken(code) is None


def seams() -> list[Seam]:
    """Every declared seam, by id."""
    _load()
    return [_registry[code] for code in sorted(_registry)]


def reset() -> None:
    """Probe again on next use (tests that simulate a drift)."""
    broken.cache_clear()


_loaded = False


def _load() -> None:
    """Import the modules that declare seams (each declares its own, beside its use)."""
    global _loaded
    if _loaded:
        return
    with _lock:
        import importlib

        for module in _DECLARING_MODULES:
            importlib.import_module(module)
        _loaded = True


#: Where the seams are declared (one module may declare several).
_DECLARING_MODULES = (
    "llm_routing.asgi",
    "llm_routing.inline_middleware",
    "llm_routing.api.reuse",
    "llm_routing.api.base",
    "llm_routing.providers.base",
)


def source_digest(func: Callable[..., object]) -> str:
    """SHA-256 of a function's source (the fingerprint of a copied function)."""
    return hashlib.sha256(inspect.getsource(func).encode("utf-8")).hexdigest()
