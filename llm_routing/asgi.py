"""The ASGI application wrapper for serving the routing API: ``with_lifespan(app)``.

Django's ASGI handler refuses the ``lifespan`` protocol, so a server has nowhere to say
"this worker stops". This wrapper answers it: at shutdown, on the worker's own event
loop, the adapters' pooled async HTTP clients are closed
(``llm_routing.providers.registry.aclose_all``, when the installed version has it), so
no connection is dropped mid-request and nothing warns about an unclosed client. Every
other scope goes to the wrapped application unchanged::

    # asgi.py
    from django.core.asgi import get_asgi_application
    from llm_routing.asgi import with_lifespan

    application = with_lifespan(get_asgi_application())
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["close_async_clients", "with_lifespan"]

logger = logging.getLogger("llm_routing.asgi")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def close_async_clients() -> None:
    """Close every pooled async HTTP client the adapters opened on this event loop."""
    from .providers import registry

    aclose_all = getattr(registry, "aclose_all", None)
    if aclose_all is None:  # an adapters module without async clients: nothing to close
        return
    result = aclose_all()
    if inspect.isawaitable(result):
        await result


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
