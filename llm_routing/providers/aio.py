"""The async upstream client over aiohttp: httpx's API, aiohttp's connection handling.

``LLM_ROUTING["ASYNC_HTTP_TRANSPORT"] = "aiohttp"`` (the default) gives each adapter's
:class:`httpx.AsyncClient` the transport of the ``httpx-aiohttp`` package: requests,
responses, timeouts and exceptions keep httpx's types, and the HTTP/1.1 connection work
(pool, parser, keep-alive) is aiohttp's, whose C parser costs a fraction of httpcore's
pure-Python h11 per call (docs/design-decisions.md, "The async upstream client").
``"httpx"`` keeps httpcore (:class:`~llm_routing.providers.base.ShardedAsyncTransport`).
The sync client is httpcore's either way.

What this module adds around the package's transport, so the failure taxonomy of
:mod:`llm_routing.providers.classify` and every adapter test run unchanged on both:

* **Exceptions.** Each aiohttp failure is raised as the httpx exception httpcore raises
  for the same failure (:func:`httpx_error_for`): connect errors and TLS failures →
  ``ConnectError``, the connect phase's timeout → ``ConnectTimeout``, a silent socket →
  ``ReadTimeout``, a server that closes early or sends a broken body →
  ``RemoteProtocolError``, a reset → ``ReadError``. The package's own table would make a
  server disconnect a ``ConnectTimeout`` (a timeout instead of a network error).
* **The pool timeout.** httpcore waits for a free connection under the ``pool`` timeout
  and raises ``PoolTimeout``; aiohttp folds that wait into its connect timeout. A
  semaphore of ``HTTP_MAX_CONNECTIONS`` slots in front of aiohttp, held until the
  response is closed, restores the separate wait and its exception.
* **The write timeout.** aiohttp has none: it starts the read timeout once the body is
  sent. A body larger than :data:`SMALL_BODY` (which goes to the socket at once) bounds
  the whole header phase by connect + write + read instead (``WriteTimeout``).
* **Cookies** are httpx's alone (aiohttp's jar is a dummy, else both would send them).
* **Clients of a loop that is gone** are closed without a loop (:func:`abandon`), so
  aiohttp never logs "Unclosed client session" / "Unclosed connector" for them.

If the package (or aiohttp) cannot be imported, :func:`transport_name` answers
``"httpx"`` and logs a warning; system check ``llm_routing.W004`` says so at start-up.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import httpx

from ..conf import routing_settings

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "SMALL_BODY",
    "TRANSPORTS",
    "AiohttpUpstreamTransport",
    "UpstreamAsyncClient",
    "abandon",
    "httpx_error_for",
    "transport_name",
    "unavailable_reason",
]

logger = logging.getLogger("llm_routing.providers")

#: The values of ``LLM_ROUTING["ASYNC_HTTP_TRANSPORT"]``.
TRANSPORTS = ("aiohttp", "httpx")

#: Request bodies up to this many bytes are handed to the socket in one write (asyncio's
#: default write-buffer high-water mark): no write can stall, the read timeout bounds
#: the rest. A larger body gets an explicit bound on its header phase.
SMALL_BODY = 64 * 1024


@functools.cache
def unavailable_reason() -> str | None:
    """Why the aiohttp transport cannot be used (None: it can): ``httpx-aiohttp`` or
    ``aiohttp`` missing, failing to import, or too old for the mapping below."""
    try:
        import aiohttp
        from httpx_aiohttp import AiohttpTransport  # noqa: F401
    except Exception as exc:  # ImportError, or anything a broken install raises
        return f"{type(exc).__name__}: {exc}"
    missing = [
        name
        for name in ("ConnectionTimeoutError", "SocketTimeoutError", "DummyCookieJar")
        if not hasattr(aiohttp, name)
    ]
    if missing:
        return f"aiohttp {aiohttp.__version__} lacks {', '.join(missing)} (needs >= 3.10)"
    return None


_warned: list[str] = []


def transport_name() -> str:
    """The async transport in use: the setting, or ``"httpx"`` when it asks for
    ``"aiohttp"`` and that cannot be imported (logged once per process; check W004)."""
    wanted = routing_settings.ASYNC_HTTP_TRANSPORT
    if wanted != "aiohttp":
        return "httpx"  # an invalid value is check E006; httpcore serves meanwhile
    reason = unavailable_reason()
    if reason is None:
        return "aiohttp"
    if reason not in _warned:
        _warned.append(reason)
        logger.warning(
            "ASYNC_HTTP_TRANSPORT is 'aiohttp' but it cannot be used (%s): the async "
            "upstream client falls back to httpx/httpcore. Install httpx-aiohttp>=0.2,<0.3.",
            reason,
        )
    return "httpx"


# --- exceptions ---------------------------------------------------------------------------
@functools.cache
def _exception_table() -> tuple[tuple[type[BaseException], type[httpx.TransportError]], ...]:
    """(aiohttp or OS exception, the httpx class httpcore raises for the same failure),
    most specific first."""
    import aiohttp
    from aiohttp.http_exceptions import HttpProcessingError

    return (
        (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
        (aiohttp.SocketTimeoutError, httpx.ReadTimeout),
        (aiohttp.ServerTimeoutError, httpx.ReadTimeout),
        (aiohttp.ClientProxyConnectionError, httpx.ProxyError),
        (aiohttp.ClientHttpProxyError, httpx.ProxyError),
        (aiohttp.ClientConnectorError, httpx.ConnectError),  # refused, DNS, TLS, certificate
        (aiohttp.ServerFingerprintMismatch, httpx.ConnectError),
        (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
        (aiohttp.ClientPayloadError, httpx.RemoteProtocolError),  # a cut or broken body
        (aiohttp.ClientResponseError, httpx.RemoteProtocolError),  # an unparsable answer
        (HttpProcessingError, httpx.RemoteProtocolError),
        (aiohttp.NonHttpUrlClientError, httpx.UnsupportedProtocol),
        (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
        (aiohttp.ClientConnectionError, httpx.ReadError),  # reset, "Connection closed"
        (TimeoutError, httpx.ReadTimeout),
        (OSError, httpx.ReadError),
        (aiohttp.ClientError, httpx.TransportError),
    )


def httpx_error_for(exc: BaseException) -> httpx.TransportError | None:
    """The httpx exception httpcore raises for the failure ``exc`` stands for: an
    aiohttp exception, or the package's httpx exception wrapping one (its ``__cause__``).
    None: not a transport failure (re-raised as it is)."""
    if isinstance(exc, httpx.TransportError):
        cause = exc.__cause__
        if cause is None or isinstance(cause, httpx.HTTPError):
            return None  # httpx's own: already right
        exc = cause
    for source, target in _exception_table():
        if isinstance(exc, source):
            return target(str(exc) or type(exc).__name__)
    return None


class _Remapped:
    """``with _Remapped():`` re-raises a transport failure as httpcore's class."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or not isinstance(exc, Exception):
            return  # no failure, or a cancellation: unchanged
        mapped = httpx_error_for(exc)
        if mapped is not None:
            raise mapped from exc


_REMAPPED = _Remapped()


# --- the transport ------------------------------------------------------------------------
class AiohttpUpstreamTransport(httpx.AsyncBaseTransport):
    """``httpx_aiohttp.AiohttpTransport`` with httpcore's exceptions, pool timeout and a
    bounded write phase (see the module doc). One per client, so one per event loop."""

    def __init__(self, limits: httpx.Limits, ssl_context: ssl.SSLContext) -> None:
        from httpx_aiohttp import AiohttpTransport

        self._limits = limits
        self._ssl_context = ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._slots = asyncio.Semaphore(int(limits.max_connections or 1))
        self._inner = AiohttpTransport(verify=ssl_context, limits=limits, client=self._new_session)

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """The verifying TLS context of every connection (the process-wide one)."""
        return self._ssl_context

    def _new_session(self) -> aiohttp.ClientSession:
        """The aiohttp session, built on the first request (inside the running loop)."""
        import aiohttp

        connector = aiohttp.TCPConnector(
            ssl=self._ssl_context,
            limit=int(self._limits.max_connections or 0),
            keepalive_timeout=self._limits.keepalive_expiry,
        )
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar()
        )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout") or {}
        await self._acquire(timeout.get("pool"))
        try:
            response = await self._send(request, timeout)
        except BaseException:
            self._slots.release()
            raise
        response.stream = _Body(response.stream, self._slots.release, self._is_closed)
        return response

    def _is_closed(self) -> bool:
        return self._closed

    async def _acquire(self, pool_timeout: float | None) -> None:
        """A connection slot; ``PoolTimeout`` after ``pool_timeout`` seconds."""
        if not self._slots.locked():
            await self._slots.acquire()  # free: returns at once
            return
        try:
            async with asyncio.timeout(pool_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout("No connection of the pool became free in time.") from None

    async def _send(self, request: httpx.Request, timeout: dict[str, Any]) -> httpx.Response:
        try:
            size = len(request.content)
        except httpx.RequestNotRead:  # a streamed body: its size is not known
            size = SMALL_BODY + 1
        with _REMAPPED:
            if size <= SMALL_BODY:
                return await self._inner.handle_async_request(request)
            phase = asyncio.timeout(_phase_bound(timeout))
            try:
                async with phase:
                    return await self._inner.handle_async_request(request)
            except TimeoutError:
                if phase.expired():
                    raise httpx.WriteTimeout(
                        "The request body was not sent and answered in time."
                    ) from None
                raise

    async def aclose(self) -> None:
        self._closed = True
        await self._inner.aclose()

    def abandon(self) -> None:
        """Close the session of a loop that no longer runs, without that loop (its
        sockets go with the garbage collector, as httpcore's do); no-op otherwise."""
        session, self._session = self._session, None
        if session is None or session.closed:
            return
        closing = session.close()
        try:
            # On a closed loop the connector has nothing it can close: the coroutine
            # ends at its first step, and the session is marked closed.
            closing.send(None)
        except StopIteration:
            return
        except Exception:  # noqa: S110 - the loop refused a callback: detach below
            pass
        closing.close()
        session.detach()  # closed from aiohttp's view: no "Unclosed client session"


def _phase_bound(timeout: dict[str, Any]) -> float | None:
    """The header phase of a call with a large body: connect + write + read."""
    parts = [timeout.get(key) for key in ("connect", "write", "read")]
    if any(part is None for part in parts):
        return None
    return float(sum(parts))  # type: ignore[arg-type]


class _Body(httpx.AsyncByteStream):
    """The response body: aiohttp's failures as httpcore's, and the connection slot
    given back when the response is closed. A body that ends because the client was
    closed meanwhile is a failure (aiohttp reads a body without a length to EOF, and
    closing the connection looks like that EOF)."""

    def __init__(
        self, inner: Any, release: Callable[[], None], client_closed: Callable[[], bool]
    ) -> None:
        self._inner = inner
        self._release: Callable[[], None] | None = release
        self._client_closed = client_closed

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _REMAPPED:
            async for chunk in self._inner:
                yield chunk
        if self._client_closed():
            raise RuntimeError("The HTTP client was closed during the call.")

    async def aclose(self) -> None:
        release, self._release = self._release, None
        try:
            with _REMAPPED:
                await self._inner.aclose()
        finally:
            if release is not None:
                release()


class UpstreamAsyncClient(httpx.AsyncClient):
    """An :class:`httpx.AsyncClient` over :class:`AiohttpUpstreamTransport`."""

    def __init__(
        self, *, limits: httpx.Limits, ssl_context: ssl.SSLContext, **options: Any
    ) -> None:
        self.upstream_transport = AiohttpUpstreamTransport(limits, ssl_context)
        super().__init__(**options, transport=self.upstream_transport)


def abandon(client: httpx.AsyncClient) -> None:
    """Drop ``client``, whose event loop no longer runs: an aiohttp one closes its
    session without the loop (no "Unclosed client session" log when it is collected);
    an httpcore one needs nothing."""
    if isinstance(client, UpstreamAsyncClient):
        client.upstream_transport.abandon()
