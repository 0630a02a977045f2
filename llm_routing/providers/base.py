"""The adapter interface.

An adapter turns one :class:`~llm_routing.types.AuditRequest` into one
:class:`~llm_routing.types.ProviderResult`, or raises a
:class:`~llm_routing.errors.ProviderError` subclass. It never touches the database and
never retries: the single retry layer is :mod:`llm_routing.resilience.retry`, and the
router turns whatever escapes into a safe error result.

The key is read from its environment variable at call time by :func:`read_api_key`
and handed to :meth:`BaseProvider.complete`; adapters must not keep it.

Each call has an async twin with the same semantics (:meth:`BaseProvider.acomplete`,
:meth:`BaseProvider.astream`, :meth:`BaseProvider.aclose`): real ``httpx.AsyncClient``
I/O in :class:`HttpProvider`, a worker thread for adapters written sync-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import math
import os
import ssl
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import httpx
from asgiref.sync import sync_to_async
from django.views.decorators.debug import sensitive_variables
from httpx_sse import EventSource, ServerSentEvent
from jsonschema.exceptions import best_match

from .. import seams
from ..cache import LoopRef, loop_ref
from ..conf import routing_settings
from ..errors import (
    InvalidRequestError,
    NetworkError,
    ProviderError,
    ProviderTimeoutError,
    ResponseError,
    scrub,
)
from ..schemas import answer_validator
from ..types import CAPABILITIES as _CAPABILITIES
from ..types import (
    AuditRequest,
    ProviderConfig,
    ProviderResult,
    StreamDelta,
    StreamEnd,
    StreamEvent,
    StreamToolCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from . import aio
from .classify import classify_http_error, from_httpx_exception, parse_retry_after
from .streaming import MalformedEvent, StreamClock, StreamDecoder
from .usage import reported_tokens

__all__ = [
    "CAPABILITIES",
    "BaseProvider",
    "HttpProvider",
    "events_of",
    "pool_limits",
    "read_api_key",
    "validate_structured",
]

logger = logging.getLogger("llm_routing.providers")

CAPABILITIES = frozenset(_CAPABILITIES)


@sensitive_variables("value")
def read_api_key(env_name: str) -> str | None:
    """The key's value, read at call time; ``None`` when unset or empty."""
    if not env_name:
        return None
    value = os.environ.get(env_name)
    if value:
        from ..logging import remember_key_env

        remember_key_env(env_name)
    return value or None


class BaseProvider(ABC):
    """Base class of every adapter kind."""

    kind: ClassVar[str] = ""
    #: Whether the adapter cannot work without a key (missing → skip ``missing_key``).
    requires_key: ClassVar[bool] = True
    #: Whether this adapter answers with mode "live" (real upstream) or "mock".
    result_mode: ClassVar[str] = "live"
    #: What the kind supports (a subset of CAPABILITIES); a provider row inherits
    #: these unless it overrides one (``supports_<capability>`` True/False, not None).
    capabilities: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config

    def supports(self, capability: str) -> bool:
        """The effective capability: the row's override, else the kind's declaration."""
        override = getattr(self.config, f"supports_{capability}", None)
        if override is not None:
            return bool(override)
        return capability in type(self).capabilities

    @abstractmethod
    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        """Call the upstream once. Raise a ProviderError subclass on failure."""

    def stream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> Iterator[StreamEvent]:
        """Yield StreamDelta / StreamToolCallDelta events, then one StreamEnd; raise a
        ProviderError on failure.

        ``timeout`` bounds the whole stream; adapters that stream natively also enforce
        ``config.first_token_timeout_s`` before the first delta and an idle timeout
        between events. This default answers in one piece through :meth:`complete`.
        """
        yield from events_of(self.complete(request, api_key=api_key, timeout=timeout))

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release pooled resources (HTTP clients)."""

    # === BEGIN async adapter interface (issue 14; branch adapters, authoritative) ======
    # ``acomplete`` / ``astream`` / ``aclose``: the same semantics and exceptions as
    # ``complete`` / ``stream`` / ``close``. These defaults serve adapters written
    # against the sync interface: offline adapters (``result_mode == "mock"``) answer
    # inline; any other runs its sync method in a worker thread
    # (``sync_to_async(thread_sensitive=False)``; a stream pulls each event in one), so
    # it never blocks the event loop. HttpProvider overrides them with real async I/O.
    async def acomplete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        """Call the upstream once from async code. Raise a ProviderError subclass on
        failure."""
        if self.result_mode == "mock":
            return self.complete(request, api_key=api_key, timeout=timeout)
        complete = sync_to_async(self.complete, thread_sensitive=False)
        return await complete(request, api_key=api_key, timeout=timeout)

    async def astream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> AsyncIterator[StreamEvent]:
        """:meth:`stream` as an async generator. Close it with ``aclose()`` (or
        ``contextlib.aclosing``) when the consumer stops early: that closes the sync
        iterator too (after a pull still running in its thread, never on the loop)."""
        iterator = self.stream(request, api_key=api_key, timeout=timeout)
        if self.result_mode != "mock":
            # aclosing: closing this generator closes the puller (and the sync iterator)
            # now, not when the garbage collector finalizes it.
            async with contextlib.aclosing(_pulled_in_threads(iterator)) as pulled:
                async for event in pulled:
                    yield event
            return
        try:
            for event in iterator:
                yield event
        finally:
            close = getattr(iterator, "close", None)
            if callable(close):
                close()

    async def aclose(self) -> None:
        """Release pooled resources from async code (this default: :meth:`close`)."""
        self.close()

    def embed(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        """Embed ``request.inputs`` in one upstream call: ``result.vectors`` holds one
        vector per input, in order. Raise a ProviderError subclass on failure. This
        default serves none (a kind that declares no ``embeddings`` capability is
        skipped as ``unsupported`` before it is called)."""
        raise InvalidRequestError(f"Provider kind {self.kind!r} does not serve embeddings.")

    async def aembed(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        """:meth:`embed` from async code (a worker thread, as :meth:`acomplete`)."""
        if self.result_mode == "mock" or type(self).embed is BaseProvider.embed:
            return self.embed(request, api_key=api_key, timeout=timeout)
        embed = sync_to_async(self.embed, thread_sensitive=False)
        return await embed(request, api_key=api_key, timeout=timeout)

    # === END async adapter interface ==================================================


class HttpProvider(BaseProvider):
    """Shared HTTP machinery of the vendor adapters: build payload → send → parse →
    normalize → raise (the django-anymail sequence).

    One pooled :class:`httpx.Client` per adapter instance (the registry pools instances
    per provider configuration and closes them when the row changes), shared by every
    thread, and one :class:`httpx.AsyncClient` per adapter instance and event loop
    (:attr:`aclient`): redirects are never followed, httpx's own transport retries are
    off (the one retry layer is :mod:`llm_routing.resilience.retry`), the pool is
    bounded by ``HTTP_MAX_CONNECTIONS`` / ``HTTP_MAX_KEEPALIVE``, the body is read by
    streaming and cut at ``LLM_ROUTING["MAX_RESPONSE_BYTES"]``, and each call gets
    separate connect / read / overall timeouts (see :meth:`timeouts`).

    Only the I/O exists twice (:meth:`send` / :meth:`asend`, :meth:`stream` /
    :meth:`astream`); payloads, headers, parsing, decoders, size limits, deadlines and
    error classification are the same code for both (:class:`_StreamRun`).

    Subclasses implement :meth:`endpoint`, :meth:`auth_headers`, :meth:`build_payload`,
    :meth:`error_details` and :meth:`parse`.
    """

    default_base_url: ClassVar[str] = ""
    #: Where a 200 body reports its tokens: (object key, input key, output key). Read
    #: again when the answer is refused after it was generated (a failed attempt that
    #: consumed tokens is charged; llm_routing.pricing).
    usage_keys: ClassVar[tuple[str, str, str]] = ("usage", "input_tokens", "output_tokens")

    def __init__(
        self,
        config: ProviderConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(config)
        self._transport = transport
        self._async_transport = async_transport
        self._client: httpx.Client | None = None
        # id(loop) → (reference to the loop, its client); an AsyncClient's connections
        # belong to the loop that opened them, so a client is never shared across loops.
        self._aclients: dict[int, tuple[LoopRef, httpx.AsyncClient]] = {}
        self._client_lock = threading.Lock()
        from ..logging import install

        install()  # idempotent: also covers loggers created after start-up

    # --- the clients --------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return (self.config.base_url or self.default_base_url).rstrip("/")

    @property
    def client(self) -> httpx.Client:
        client = self._client
        if client is None:
            with self._client_lock:
                client = self._client
                if client is None:
                    client = self._client = self._build_client()
        return client

    @property
    def aclient(self) -> httpx.AsyncClient:
        """The async client of the running event loop, built on its first use there
        (call it from a coroutine)."""
        loop = asyncio.get_running_loop()
        entry = self._aclients.get(id(loop))
        if entry is not None and entry[0]() is loop:
            return entry[1]
        with self._client_lock:
            entry = self._aclients.get(id(loop))
            if entry is not None and entry[0]() is loop:
                return entry[1]
            # Clients of loops that are gone or closed cannot be closed any more: drop.
            for key, (ref, stale) in list(self._aclients.items()):
                owner = ref()
                if owner is None or owner.is_closed():
                    del self._aclients[key]
                    aio.abandon(stale)
            client = self._build_async_client()
            self._aclients[id(loop)] = (loop_ref(loop), client)
        return client

    def client_options(self) -> dict[str, Any]:
        """What the sync and the async client share."""
        return {
            "follow_redirects": False,
            "timeout": self.timeouts(self.config.timeout_s),
            "headers": {"user-agent": f"django-llm-routing/{_version()}"},
        }

    def _build_client(self) -> httpx.Client:
        # The limits go to the transport: httpx ignores a client's ``limits`` when it
        # is given a transport.
        transport = self._transport or httpx.HTTPTransport(
            retries=0, limits=pool_limits(), verify=shared_ssl_context()
        )
        return httpx.Client(**self.client_options(), transport=transport)

    def _build_async_client(self) -> httpx.AsyncClient:
        """httpx over aiohttp or over httpcore, as ``ASYNC_HTTP_TRANSPORT`` says
        (:func:`llm_routing.providers.aio.transport_name`); a transport given to the
        constructor wins."""
        if self._async_transport is not None:
            return httpx.AsyncClient(**self.client_options(), transport=self._async_transport)
        if aio.transport_name() == "aiohttp":
            return aio.UpstreamAsyncClient(
                **self.client_options(), limits=pool_limits(), ssl_context=shared_ssl_context()
            )
        transport = ShardedAsyncTransport.from_limits(pool_limits())
        return httpx.AsyncClient(**self.client_options(), transport=transport)

    def _take_clients(
        self,
    ) -> tuple[
        httpx.Client | None, list[tuple[asyncio.AbstractEventLoop | None, httpx.AsyncClient]]
    ]:
        with self._client_lock:
            client, self._client = self._client, None
            aclients = [(ref(), aclient) for ref, aclient in self._aclients.values()]
            self._aclients.clear()
        return client, aclients

    def close(self) -> None:
        """Close the sync client now; each async client is closed on its own loop when
        that loop is running (scheduled, not waited for), else dropped."""
        client, aclients = self._take_clients()
        if client is not None:
            client.close()
        for loop, aclient in aclients:
            _close_on_owner(loop, aclient)

    async def aclose(self) -> None:
        """Close every client: the running loop's async client is awaited, the others
        are handled as in :meth:`close`."""
        current = asyncio.get_running_loop()
        client, aclients = self._take_clients()
        if client is not None:
            client.close()
        for loop, aclient in aclients:
            if loop is current:
                await aclient.aclose()
            else:
                _close_on_owner(loop, aclient)

    def timeouts(self, overall: float) -> httpx.Timeout:
        """Connect: ``CONNECT_TIMEOUT_S`` (never above the row's first-token timeout);
        read/write: the overall budget of this call — the row's ``timeout_s`` clamped by
        what the request-wide deadline leaves (``overall``)."""
        total = max(0.001, min(float(self.config.timeout_s), float(overall)))
        connect = min(
            float(routing_settings.CONNECT_TIMEOUT_S),
            float(self.config.first_token_timeout_s),
            total,
        )
        return httpx.Timeout(connect=connect, read=total, write=total, pool=connect)

    # --- the sequence -------------------------------------------------------------
    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        started = time.perf_counter()
        call = self._prepare(request, api_key, timeout)
        status, headers, body = self.send(
            call.url, call.headers, call.payload, call.timeouts, call.deadline
        )
        return self._result(request, started, status, headers, body)

    async def acomplete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        """:meth:`complete` on the running loop's :class:`httpx.AsyncClient`. A
        subclass that overrides the sync :meth:`complete` or :meth:`send` (and not
        this) keeps its override: it runs in a worker thread."""
        if _overridden(self, "complete", "send"):
            return await super().acomplete(request, api_key=api_key, timeout=timeout)
        started = time.perf_counter()
        call = self._prepare(request, api_key, timeout)
        status, headers, body = await self.asend(
            call.url, call.headers, call.payload, call.timeouts, call.deadline
        )
        return self._result(request, started, status, headers, body)

    def _prepare(self, request: AuditRequest, api_key: str | None, timeout: float) -> _Call:
        timeouts = self.timeouts(timeout)
        embed = request.call == "embed"
        return _Call(
            url=self.embed_endpoint(request) if embed else self.endpoint(request),
            headers={"content-type": "application/json", **self.auth_headers(api_key)},
            payload=self.embed_payload(request) if embed else self.build_payload(request),
            timeouts=timeouts,
            deadline=time.monotonic() + float(timeouts.read or timeout),
        )

    def _result(
        self,
        request: AuditRequest,
        started: float,
        status: int,
        headers: httpx.Headers,
        body: bytes,
    ) -> ProviderResult:
        result = self.parse_answer(request, status, headers, body)
        return replace(result, latency_ms=(time.perf_counter() - started) * 1000)

    def parse_answer(
        self, request: AuditRequest, status: int, headers: httpx.Headers, body: bytes
    ) -> ProviderResult:
        """A whole (non-streamed) answer: raise its classified error, or parse it."""
        if status >= 400:
            raise self.error_from_response(status, headers, body)
        if status != 200:
            raise ResponseError(
                f"The provider answered HTTP {status} instead of 200.", http_status=status
            )
        data = self.decode(body)
        self.raise_for_error_body(data)
        try:
            if request.call == "embed":
                return self.parse_embeddings(data, request)
            return self.parse(data, request)
        except ProviderError as exc:
            exc.usage = self.usage_of(data)  # e.g. a structured answer that is invalid
            raise

    def usage_of(self, data: Any) -> Usage | None:
        """The tokens a decoded 200 body reports (:attr:`usage_keys`), or None."""
        where, input_key, output_key = self.usage_keys
        usage = data.get(where) if isinstance(data, dict) else None
        if not isinstance(usage, dict):
            return None
        return Usage(
            input_tokens=_int(usage.get(input_key), "input_tokens"),
            output_tokens=_int(usage.get(output_key), "output_tokens"),
        )

    def send(
        self,
        url: str,
        headers: Mapping[str, str],
        payload: Mapping[str, Any],
        timeouts: httpx.Timeout,
        deadline: float,
    ) -> tuple[int, httpx.Headers, bytes]:
        """POST ``payload``; read at most ``MAX_RESPONSE_BYTES`` before ``deadline``."""
        client = self.client
        try:
            with client.stream(
                "POST", url, json=payload, headers=dict(headers), timeout=timeouts
            ) as response:
                _check_declared_size(response)
                return response.status_code, response.headers, _read_limited(response, deadline)
        except (httpx.HTTPError, httpx.InvalidURL, RuntimeError) as exc:
            # ``from None``: the httpx exception carries the URL and request; only the
            # classified, key-free error escapes.
            raise _call_failure(exc, client.is_closed) from None

    async def asend(
        self,
        url: str,
        headers: Mapping[str, str],
        payload: Mapping[str, Any],
        timeouts: httpx.Timeout,
        deadline: float,
    ) -> tuple[int, httpx.Headers, bytes]:
        """:meth:`send` on the running loop's :class:`httpx.AsyncClient`."""
        client = self.aclient
        try:
            async with client.stream(
                "POST", url, json=payload, headers=dict(headers), timeout=timeouts
            ) as response:
                _check_declared_size(response)
                body = await _aread_limited(response, deadline)
                return response.status_code, response.headers, body
        except (httpx.HTTPError, httpx.InvalidURL, RuntimeError) as exc:
            raise _call_failure(exc, client.is_closed) from None

    # --- streaming ------------------------------------------------------------------
    def stream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> Iterator[StreamEvent]:
        """Stream natively over SSE (see :mod:`llm_routing.providers.streaming`).

        Pre-first-token failures raise (the router may still fail over); a body that
        ends without a finish reason ends the generator without a StreamEnd (the
        router reports the cut); a malformed event is skipped and logged; a
        structured answer is validated once complete. The per-phase deadlines are
        enforced by the watchdog thread (:class:`StreamClock`).
        """
        run = self._stream_run(request, api_key, timeout)
        if run is None:  # a subclass without a native stream: answer in one piece
            yield from super().stream(request, api_key=api_key, timeout=timeout)
            return
        client, clock = self.client, run.clock
        end: StreamEnd | None = None
        try:
            clock.waiting()
            with client.stream(
                "POST", run.url, json=run.payload, headers=run.headers, timeout=run.timeouts
            ) as response:
                if not run.is_stream(response):
                    body = _read_limited(response, clock.overall_at)
                    yield from self._answer_in_one_piece(
                        request, response.status_code, response.headers, body
                    )
                    return
                clock.attach(response)
                # Body reads get a socket backstop; the watchdog enforces the phases.
                _set_body_read_timeout(response, run.body_read_timeout)
                for event in EventSource(response).iter_sse():
                    clock.waiting()  # an event is not silence: the idle clock restarts
                    for item in run.feed(event, response.num_bytes_downloaded):
                        clock.got_token()
                        clock.paused()
                        yield item
                        clock.waiting()
                    if run.done:
                        break
                end = run.end()
        except (httpx.HTTPError, httpx.InvalidURL, RuntimeError) as exc:
            if clock.expired and isinstance(exc, httpx.HTTPError):
                raise clock.error() from None
            raise _call_failure(exc, client.is_closed) from None
        finally:
            clock.close()
        # The connection is released before the end reaches the consumer.
        if end is not None:
            yield end

    async def astream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> AsyncIterator[StreamEvent]:
        """:meth:`stream` on the running loop's :class:`httpx.AsyncClient`: the same
        events and errors. The per-phase deadlines are ``asyncio`` timeouts around each
        wait for the upstream (no watchdog). Closing the generator (``aclose()``) or
        cancelling its task closes the upstream response at once. A subclass that
        overrides the sync :meth:`stream` (and not this) keeps its override: it runs
        in worker threads."""
        if _overridden(self, "stream"):
            async for item in super().astream(request, api_key=api_key, timeout=timeout):
                yield item
            return
        run = self._stream_run(request, api_key, timeout)
        if run is None:  # no native stream: answer in one piece
            result = await self.acomplete(request, api_key=api_key, timeout=timeout)
            for item in events_of(result):
                yield item
            return
        client, clock = self.aclient, run.clock
        end: StreamEnd | None = None
        try:
            # Headers are waited for under the first-token deadline; httpx's own read
            # timeout is only the overall backstop (the asyncio timeouts are exact).
            deadline = clock.next_deadline()
            try:
                async with asyncio.timeout(_remaining(deadline)):
                    response = await client.send(
                        client.build_request(
                            "POST",
                            run.url,
                            json=run.payload,
                            headers=run.headers,
                            timeout=run.async_timeouts,
                        ),
                        stream=True,
                    )
            except TimeoutError:
                raise clock.timed_out(deadline) from None
            try:
                if not run.is_stream(response):
                    body = await _aread_limited(response, clock.overall_at)
                    for item in self._answer_in_one_piece(
                        request, response.status_code, response.headers, body
                    ):
                        yield item
                    return
                events = EventSource(response).aiter_sse()
                try:
                    while True:
                        deadline = clock.next_deadline()
                        try:
                            async with asyncio.timeout(_remaining(deadline)):
                                event = await anext(events)
                        except StopAsyncIteration:
                            break
                        except TimeoutError:
                            raise clock.timed_out(deadline) from None
                        for item in run.feed(event, response.num_bytes_downloaded):
                            clock.got_token()
                            yield item  # the next deadline is armed after the consumer
                        if run.done:
                            break
                finally:
                    await events.aclose()
                end = run.end()
            finally:
                # Also on aclose() / cancellation: the upstream request is closed.
                await response.aclose()
        except (httpx.HTTPError, httpx.InvalidURL, RuntimeError) as exc:
            raise _call_failure(exc, client.is_closed) from None
        # The connection is released before the end reaches the consumer.
        if end is not None:
            yield end

    def _stream_run(
        self, request: AuditRequest, api_key: str | None, timeout: float
    ) -> _StreamRun | None:
        """Everything about one native stream except its I/O (None: no native stream)."""
        decoder = self.stream_decoder(request)
        if decoder is None:
            return None
        return _StreamRun(self, request, api_key, decoder, timeout)

    #: Malformed events skipped before a stream is declared unusable.
    max_skipped_events: ClassVar[int] = 3

    def _answer_in_one_piece(
        self, request: AuditRequest, status: int, headers: httpx.Headers, body: bytes
    ) -> Iterator[StreamEvent]:
        """An error status, or a 200 that is not SSE (a server ignoring ``stream``)."""
        yield from events_of(self.parse_answer(request, status, headers, body))

    def stream_decoder(self, request: AuditRequest) -> StreamDecoder | None:
        """The vendor's SSE decoder for one stream; None → no native streaming."""
        return None

    def stream_endpoint(self, request: AuditRequest) -> str:
        return self.endpoint(request)

    def stream_payload(self, request: AuditRequest) -> dict[str, Any]:
        return {**self.build_payload(request), "stream": True}

    def decode(self, body: bytes) -> Any:
        try:
            return json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise ResponseError("The provider's response is not valid JSON.") from None

    def error_from_response(
        self, status: int, headers: httpx.Headers, body: bytes
    ) -> ProviderError:
        try:
            data = json.loads(body.decode("utf-8")) if body else None
        except (UnicodeDecodeError, ValueError, RecursionError):
            data = None
        message, codes = self.error_details(data) if data is not None else ("", ())
        return classify_http_error(
            status,
            message=message or f"The provider answered HTTP {status}.",
            codes=codes,
            retry_after=parse_retry_after(headers),
        )

    def raise_for_error_body(self, data: Any) -> None:
        """A 200 whose body (or stream event) is an error object is still an error."""
        if isinstance(data, dict) and data.get("error"):
            message, codes = self.error_details(data)
            raise classify_http_error(
                200, message=message or "The provider answered 200 with an error.", codes=codes
            )

    # --- vendor specifics -----------------------------------------------------------
    @abstractmethod
    def endpoint(self, request: AuditRequest) -> str:
        """The absolute URL to POST to (never carrying the key)."""

    @abstractmethod
    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        """The headers that authenticate (and version) the call."""

    @abstractmethod
    def build_payload(self, request: AuditRequest) -> dict[str, Any]:
        """The vendor's request body."""

    @abstractmethod
    def error_details(self, data: Any) -> tuple[str, tuple[object, ...]]:
        """(message, vendor codes) from the vendor's error body."""

    @abstractmethod
    def parse(self, data: Any, request: AuditRequest) -> ProviderResult:
        """The normalized result of a 200 body; raise ResponseError when malformed."""

    # --- embeddings (a kind that serves them overrides the three hooks) -----------------
    def embed(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        """:meth:`complete`'s sequence with the embeddings hooks (:meth:`embed_endpoint`,
        :meth:`embed_payload`, :meth:`parse_embeddings`): the same client, limits,
        deadlines and error classification."""
        return self.complete(request, api_key=api_key, timeout=timeout)

    async def aembed(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        return await self.acomplete(request, api_key=api_key, timeout=timeout)

    def embed_endpoint(self, request: AuditRequest) -> str:
        """The absolute URL of an embeddings call (this default: the kind has none)."""
        raise InvalidRequestError(f"Provider kind {self.kind!r} does not serve embeddings.")

    def embed_payload(self, request: AuditRequest) -> dict[str, Any]:
        """The vendor's embeddings request body."""
        raise InvalidRequestError(f"Provider kind {self.kind!r} does not serve embeddings.")

    def parse_embeddings(self, data: Any, request: AuditRequest) -> ProviderResult:
        """The vectors of a 200 body (``result.vectors``); raise ResponseError when
        malformed. Their count and length are checked by the walk
        (:func:`llm_routing.providers.embeddings.checked_answer`)."""
        raise ResponseError(f"Provider kind {self.kind!r} does not serve embeddings.")

    # --- helpers for subclasses -------------------------------------------------------
    def extra_params(self, reserved: frozenset[str]) -> dict[str, Any]:
        """``params`` of the row, minus the keys the adapter sets itself."""
        return {k: v for k, v in (self.config.params or {}).items() if k not in reserved}

    def ok_result(
        self,
        *,
        model: object,
        output: str,
        data: Any = None,
        input_tokens: object = 0,
        output_tokens: object = 0,
        finish_reason: object = None,
        tool_calls: tuple[ToolCall, ...] = (),
        vectors: tuple[Sequence[float], ...] = (),
    ) -> ProviderResult:
        return ProviderResult(
            vectors=vectors,
            provider=self.config.name,
            model=str(model) if isinstance(model, str) and model else self.config.model,
            mode="live",
            status="ok",
            output=output,
            data=data,
            usage=Usage(
                input_tokens=_int(input_tokens, "input_tokens"),
                output_tokens=_int(output_tokens, "output_tokens"),
            ),
            finish_reason=str(finish_reason) if finish_reason is not None else None,
            tool_calls=tool_calls,
        )


async def _pulled_in_threads(iterator: Iterator[StreamEvent]) -> AsyncGenerator[StreamEvent, None]:
    """A sync event iterator consumed from async code, each ``next()`` in a worker
    thread. On exit (end, error, ``aclose()``, cancellation) the iterator is closed —
    after a pull still running in its thread, so never concurrently with it."""
    lock = threading.Lock()

    def pull() -> StreamEvent | None:
        with lock:
            return next(iterator, None)

    def close() -> None:
        with lock:
            close_iterator = getattr(iterator, "close", None)
            if callable(close_iterator):
                close_iterator()

    step = sync_to_async(pull, thread_sensitive=False)
    try:
        while (event := await step()) is not None:
            yield event
    finally:
        if lock.locked():  # cancelled while a pull runs: close after it, off the loop
            threading.Thread(target=close, name="llm-routing-stream-close", daemon=True).start()
        else:
            await sync_to_async(close, thread_sensitive=False)()


def events_of(result: ProviderResult) -> Iterator[StreamEvent]:
    """A whole answer as stream events: its text in one delta, one delta per tool call
    (id, name and the full arguments), then the end carrying the calls."""
    if result.output:
        yield StreamDelta(result.output)
    for index, call in enumerate(result.tool_calls):
        yield StreamToolCallDelta(
            ToolCallDelta(index=index, id=call.id, name=call.name, arguments=call.arguments)
        )
    yield StreamEnd(
        finish_reason=result.finish_reason,
        usage=result.usage,
        model=result.model,
        tool_calls=result.tool_calls,
    )


@dataclass(frozen=True)
class _Call:
    """One non-streamed call, built once for either I/O path."""

    url: str
    headers: dict[str, str]
    payload: dict[str, Any]
    timeouts: httpx.Timeout
    deadline: float


class _StreamRun:
    """Everything about one native stream except its I/O, shared by
    :meth:`HttpProvider.stream` and :meth:`HttpProvider.astream`: the request, the
    phase deadlines (:class:`StreamClock`), the size limit, the vendor decoder, the
    malformed-event budget and the final validation."""

    def __init__(
        self,
        provider: HttpProvider,
        request: AuditRequest,
        api_key: str | None,
        decoder: StreamDecoder,
        timeout: float,
    ) -> None:
        config = provider.config
        overall = max(0.001, min(float(config.timeout_s), float(timeout)))
        first_token = max(0.001, min(float(config.first_token_timeout_s), overall))
        idle = max(0.001, float(routing_settings.STREAM_IDLE_TIMEOUT_S))
        base = provider.timeouts(timeout)
        self.provider = provider
        self.request = request
        self.api_key = api_key
        self.decoder = decoder
        self.url = provider.stream_endpoint(request)
        self.payload = provider.stream_payload(request)
        self.headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            **provider.auth_headers(api_key),
        }
        # Sync: headers are waited for under the first-token timeout, body reads get a
        # socket backstop (body_read_timeout); the watchdog enforces the exact phases.
        self.body_read_timeout = min(max(first_token, idle), overall)
        # Without the guarded seam (W028) the body's read timeout cannot be set after
        # the headers: the larger one then applies from the start.
        header_read = first_token if seams.available("W028") else self.body_read_timeout
        self.timeouts = httpx.Timeout(
            connect=base.connect, read=header_read, write=overall, pool=base.pool
        )
        # Async: asyncio timeouts enforce the phases; httpx's read timeout is the
        # overall backstop.
        self.async_timeouts = httpx.Timeout(
            connect=base.connect, read=overall, write=overall, pool=base.pool
        )
        self.clock = StreamClock(first_token_s=first_token, idle_s=idle, overall_s=overall)
        self.limit = int(routing_settings.MAX_RESPONSE_BYTES)
        self.skipped = 0

    @staticmethod
    def is_stream(response: httpx.Response) -> bool:
        """Whether the answer is an SSE stream (else an error or a whole answer)."""
        return response.status_code == 200 and _is_event_stream(response)

    @property
    def done(self) -> bool:
        return self.decoder.done

    def feed(self, event: ServerSentEvent, downloaded: int) -> list[StreamEvent]:
        """The stream events one SSE event carries (``downloaded``: body bytes so far)."""
        if downloaded > self.limit:
            raise ResponseError(
                f"The provider's stream is larger than {self.limit} bytes.", http_status=200
            )
        try:
            items = self.decoder.feed(event)
        except ProviderError as exc:
            # An in-band error is raised after the commit point too, where no retry
            # layer scrubs it: its vendor message may echo the key.
            raise _scrubbed(exc, self.api_key) from None
        except MalformedEvent:
            self.skipped += 1
            logger.warning(
                "Skipped a malformed stream event from %s (%d bytes, #%d)",
                self.provider.config.name,
                len(event.data),
                self.skipped,
            )
            if self.skipped > self.provider.max_skipped_events:
                raise ResponseError(
                    "The provider's stream has too many malformed events."
                ) from None
            return []
        return [
            StreamDelta(item) if isinstance(item, str) else StreamToolCallDelta(item)
            for item in items
        ]

    def end(self) -> StreamEnd | None:
        """The clean end (None: the stream was cut), its structured answer validated."""
        if self.clock.expired and not self.decoder.done:  # an end marker beats a late alarm
            raise self.clock.error()
        end = self.decoder.end()
        # A tool-call answer carries no structured text to validate.
        if (
            end is not None
            and self.request.response_schema is not None
            and (self.decoder.text or not end.tool_calls)
        ):
            validate_structured(self.decoder.text, self.request.response_schema)
        return end


class _BodyLimit:
    """The body of one answer as it arrives, cut at ``MAX_RESPONSE_BYTES`` and abandoned
    after ``deadline``."""

    def __init__(self, response: httpx.Response, deadline: float) -> None:
        self.limit = int(routing_settings.MAX_RESPONSE_BYTES)
        self.status = response.status_code
        self.deadline = deadline
        self.chunks: list[bytes] = []
        self.size = 0

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise ResponseError(
                f"The provider's response is larger than {self.limit} bytes.",
                http_status=self.status,
            )
        if time.monotonic() > self.deadline:
            raise ProviderTimeoutError("The provider did not finish its answer in time.")
        self.chunks.append(chunk)

    def body(self) -> bytes:
        return b"".join(self.chunks)


def _check_declared_size(response: httpx.Response) -> None:
    """A ``Content-Length`` above ``MAX_RESPONSE_BYTES`` fails before any read."""
    limit = int(routing_settings.MAX_RESPONSE_BYTES)
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ResponseError(
            f"The provider's response is larger than {limit} bytes.",
            http_status=response.status_code,
        )


def _read_limited(response: httpx.Response, deadline: float) -> bytes:
    """The body, cut at ``MAX_RESPONSE_BYTES`` and abandoned after ``deadline``."""
    body = _BodyLimit(response, deadline)
    for chunk in response.iter_bytes():
        body.add(chunk)
    return body.body()


async def _aread_limited(response: httpx.Response, deadline: float) -> bytes:
    """:func:`_read_limited` of an async response."""
    body = _BodyLimit(response, deadline)
    async for chunk in response.aiter_bytes():
        body.add(chunk)
    return body.body()


def _call_failure(exc: Exception, client_closed: bool) -> Exception:
    """What escapes an adapter for a failure of the HTTP call (sync or async: httpx's
    exception classes are shared): the classified, key-free error — never the httpx
    exception, which carries the URL and request."""
    if isinstance(exc, httpx.HTTPError | httpx.InvalidURL):
        return from_httpx_exception(exc)
    if client_closed:  # the registry closed this client (the row changed) mid-call
        return NetworkError("The HTTP client was closed during the call.")
    return exc


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """The one verifying TLS context of every upstream client in this process (sync and
    async, every shard): httpx builds a context per transport by default, and each loads
    the CA bundle — measured 40 ms and 0.9 MiB apiece, so an async pool of 32 shards
    blocked its event loop for 1.3 s on its first call and held 28 MiB
    (docs/benchmarks.md, "Memory per worker"). httpx's own defaults (certifi,
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` read once, at the first client). One context
    serving many connections is how :mod:`ssl` is meant to be used (thread-safe, no
    per-connection state); it holds no socket, so it survives a fork."""
    return httpx.create_ssl_context()


def pool_limits() -> httpx.Limits:
    """The connection-pool bounds of every adapter client (sync and async):
    ``HTTP_MAX_CONNECTIONS`` and ``HTTP_MAX_KEEPALIVE``."""
    return httpx.Limits(
        max_connections=int(routing_settings.HTTP_MAX_CONNECTIONS),
        max_keepalive_connections=int(routing_settings.HTTP_MAX_KEEPALIVE),
    )


#: Connections per shard of an async pool (:class:`ShardedAsyncTransport`).
POOL_SHARD_SIZE = 32


class ShardedAsyncTransport(httpx.AsyncBaseTransport):
    """Several httpcore connection pools behind one transport, taken in turn.

    httpcore assigns a request to a connection by scanning every connection of its pool
    (and polls each idle one's socket): its cost per request grows with the pool, so a
    pool of a thousand connections spends more time scanning than sending. Shards of
    :data:`POOL_SHARD_SIZE` connections keep each scan short; together they hold the
    configured limits (``HTTP_MAX_CONNECTIONS`` / ``HTTP_MAX_KEEPALIVE``). Measured in
    docs/benchmarks.md ("Async upstream pool")."""

    def __init__(self, shards: list[httpx.AsyncHTTPTransport]) -> None:
        self._shards = shards
        self._turn = itertools.count()

    @classmethod
    def from_limits(cls, limits: httpx.Limits) -> ShardedAsyncTransport:
        total = int(limits.max_connections or 1)
        count = max(1, math.ceil(total / POOL_SHARD_SIZE))
        keepalive = int(limits.max_keepalive_connections or 0)
        shard_limits = httpx.Limits(
            max_connections=math.ceil(total / count),
            max_keepalive_connections=math.ceil(keepalive / count),
            keepalive_expiry=limits.keepalive_expiry,
        )
        ssl_context = shared_ssl_context()
        return cls(
            [
                httpx.AsyncHTTPTransport(retries=0, limits=shard_limits, verify=ssl_context)
                for _ in range(count)
            ]
        )

    @property
    def shards(self) -> tuple[httpx.AsyncHTTPTransport, ...]:
        return tuple(self._shards)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        shard = self._shards[next(self._turn) % len(self._shards)]
        return await shard.handle_async_request(request)

    async def aclose(self) -> None:
        for shard in self._shards:
            await shard.aclose()


def _overridden(provider: HttpProvider, *names: str) -> bool:
    """Whether the adapter's class replaces one of HttpProvider's sync I/O methods."""
    cls = type(provider)
    return any(getattr(cls, name) is not getattr(HttpProvider, name) for name in names)


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _close_on_owner(loop: asyncio.AbstractEventLoop | None, client: httpx.AsyncClient) -> None:
    """Close ``client`` on the loop that owns its connections when that loop runs
    (scheduled, not waited for); a client of a stopped or closed loop is dropped (its
    connections cannot be closed from another loop; an aiohttp one is marked closed so
    it is collected without a log: :func:`llm_routing.providers.aio.abandon`)."""
    if loop is None or loop.is_closed() or not loop.is_running():
        aio.abandon(client)
        return
    try:
        asyncio.run_coroutine_threadsafe(client.aclose(), loop)
    except RuntimeError:  # closed in between
        pass


def _scrubbed(exc: ProviderError, api_key: str | None) -> ProviderError:
    from ..logging import known_key_values

    exc.message = scrub(exc.message, (api_key, *known_key_values()))
    exc.args = (exc.message,)
    return exc


def _is_event_stream(response: httpx.Response) -> bool:
    return "text/event-stream" in response.headers.get("content-type", "").lower()


def _set_body_read_timeout(response: httpx.Response, seconds: float) -> None:
    """The per-read socket timeout of the body (httpcore reads it when the body starts):
    a backstop behind the watchdog, long enough for either phase. Changing the request's
    ``timeout`` extension after sending is a seam of httpcore's (W028, guarded)."""
    timeout = response.request.extensions.get("timeout")
    if isinstance(timeout, dict) and seams.available("W028"):
        timeout["read"] = seconds


@seams.register(
    "W028",
    "httpcore reading the request's timeout extension when a response body read starts",
    "a streamed call's read timeout is the body's from the start (the header wait is "
    "then bounded by it rather than by the first-token timeout)",
)
def _probe_body_timeout() -> str | None:
    import inspect

    import httpcore

    connection = getattr(httpcore, "HTTP11Connection", None)
    body = getattr(connection, "_receive_response_body", None)
    if body is None:
        return "httpcore.HTTP11Connection has no _receive_response_body"
    if 'extensions.get("timeout"' not in inspect.getsource(body):
        return "httpcore no longer reads the timeout extension when the body starts"
    return None


def validate_structured(text_or_data: Any, schema: Mapping[str, Any] | None) -> Any:
    """Parse (when a string) and validate structured output; ResponseError when invalid.

    The message names the failing path and keyword only — never the value, which is
    model output and may echo the input.
    """
    if isinstance(text_or_data, str):
        try:
            value = json.loads(text_or_data)
        except (ValueError, RecursionError):
            raise ResponseError("The structured output is not valid JSON.") from None
    else:
        value = text_or_data
    if schema is None:
        return value
    try:
        # No retrieval (a remote $ref is unresolvable, never fetched), RE2 patterns.
        validator = answer_validator(schema)
        error = best_match(validator.iter_errors(value))
    except Exception:  # a schema jsonschema cannot apply
        raise ResponseError("The structured output could not be validated.") from None
    if error is not None:
        path = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise ResponseError(
            f"The structured output does not match the schema at {path} "
            f"(fails {error.validator!r})."
        )
    return value


def _int(value: object, field: str) -> int:
    """A whole answer's token count (:func:`~llm_routing.providers.usage.reported_tokens`:
    bounded), 0 when the upstream reported none that can be read."""
    return reported_tokens(value, field=field) or 0


def _version() -> str:
    from ..version import __version__

    return __version__
