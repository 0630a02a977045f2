"""The ASGI application wrapper for serving the routing API: ``with_lifespan(app)``.

Django's ASGI handler refuses the ``lifespan`` protocol, so a server has nowhere to say
"this worker stops". This wrapper answers it: at shutdown, on the worker's own event
loop, the adapters' pooled async HTTP clients are closed
(``llm_routing.providers.registry.aclose_all``), so nothing warns about an unclosed
client and no socket outlives its loop. Every
other scope goes to the wrapped application unchanged::

    # asgi.py
    from django.core.asgi import get_asgi_application
    from llm_routing.asgi import with_lifespan

    application = with_lifespan(get_asgi_application())
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import django
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler

__all__ = [
    "InlineMiddlewareASGIHandler",
    "close_async_clients",
    "get_asgi_application",
    "with_lifespan",
]

logger = logging.getLogger("llm_routing.asgi")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def close_async_clients() -> None:
    """Close every pooled adapter and its async HTTP clients (this event loop's)."""
    from .providers import registry  # not at import: asgi.py imports this before setup

    await registry.aclose_all()


def with_lifespan(app: ASGIApp) -> ASGIApp:
    """``app`` with the ASGI ``lifespan`` protocol answered (see the module doc)."""

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await close_async_clients()
                except Exception as exc:  # shutting down anyway: say so, never hang
                    logger.warning(
                        "Closing the async HTTP clients failed (%s).", type(exc).__name__
                    )
                await send({"type": "lifespan.shutdown.complete"})
                return

    return application


class InlineMiddlewareASGIHandler(ASGIHandler):
    """Django's ASGI handler that loads :mod:`llm_routing.inline_middleware`'s subclasses
    in place of Django's stock middleware named in ``MIDDLEWARE``: their hooks run on
    the event loop instead of hopping, twice each, to Django's one shared thread."""

    def load_middleware(self, is_async: bool = False) -> None:
        from .inline_middleware import INLINE

        stock = getattr(base, "import_string")  # noqa: B009

        def import_inline(path: str) -> Any:
            return INLINE.get(path) or stock(path)

        setattr(base, "import_string", import_inline)  # noqa: B010 - startup, one thread
        try:
            super().load_middleware(is_async=is_async)
        finally:
            setattr(base, "import_string", stock)  # noqa: B010


def get_asgi_application() -> ASGIApp:
    """:func:`django.core.asgi.get_asgi_application` with the inline middleware and the
    lifespan protocol answered (what the demo project's ``asgi.py`` serves)."""
    django.setup(set_prefix=False)
    return with_lifespan(InlineMiddlewareASGIHandler())
