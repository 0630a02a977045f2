"""The adapter interface.

An adapter turns one :class:`~llm_routing.types.AuditRequest` into one
:class:`~llm_routing.types.ProviderResult`, or raises a
:class:`~llm_routing.errors.ProviderError` subclass. It never touches the database and
never retries: the single retry layer is :mod:`llm_routing.resilience.retry`, and the
router turns whatever escapes into a safe error result.

The key is read from its environment variable at call time by :func:`read_api_key`
and handed to :meth:`BaseProvider.complete`; adapters must not keep it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any, ClassVar

import httpx
from django.views.decorators.debug import sensitive_variables
from httpx_sse import EventSource
from jsonschema.exceptions import best_match

from ..conf import routing_settings
from ..errors import (
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
from .classify import classify_http_error, from_httpx_exception, parse_retry_after
from .streaming import MalformedEvent, StreamClock, StreamDecoder

__all__ = [
    "CAPABILITIES",
    "BaseProvider",
    "HttpProvider",
    "events_of",
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


class HttpProvider(BaseProvider):
    """Shared HTTP machinery of the vendor adapters: build payload → send → parse →
    normalize → raise (the django-anymail sequence).

    One pooled :class:`httpx.Client` per adapter instance (the registry pools instances
    per provider configuration and closes them when the row changes), shared by every
    thread: redirects are never followed, httpx's own transport retries are off (the one
    retry layer is :mod:`llm_routing.resilience.retry`), the body is read by streaming
    and cut at ``LLM_ROUTING["MAX_RESPONSE_BYTES"]``, and each call gets separate
    connect / read / overall timeouts (see :meth:`timeouts`).

    Subclasses implement :meth:`endpoint`, :meth:`auth_headers`, :meth:`build_payload`,
    :meth:`error_details` and :meth:`parse`.
    """

    default_base_url: ClassVar[str] = ""
    #: Where a 200 body reports its tokens: (object key, input key, output key). Read
    #: again when the answer is refused after it was generated (a failed attempt that
    #: consumed tokens is charged; llm_routing.pricing).
    usage_keys: ClassVar[tuple[str, str, str]] = ("usage", "input_tokens", "output_tokens")

    def __init__(
        self, config: ProviderConfig, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        super().__init__(config)
        self._transport = transport
        self._client: httpx.Client | None = None
        self._client_lock = threading.Lock()
        from ..logging import install

        install()  # idempotent: also covers loggers created after start-up

    # --- the client ---------------------------------------------------------------
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

    def _build_client(self) -> httpx.Client:
        return httpx.Client(
            follow_redirects=False,
            timeout=self.timeouts(self.config.timeout_s),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            headers={"user-agent": f"django-llm-routing/{_version()}"},
            transport=self._transport or httpx.HTTPTransport(retries=0),
        )

    def close(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

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
        timeouts = self.timeouts(timeout)
        deadline = time.monotonic() + float(timeouts.read or timeout)
        payload = self.build_payload(request)
        headers = {"content-type": "application/json", **self.auth_headers(api_key)}
        status, response_headers, body = self.send(
            self.endpoint(request), headers, payload, timeouts, deadline
        )
        result = self.parse_answer(request, status, response_headers, body)
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
            input_tokens=_int(usage.get(input_key)), output_tokens=_int(usage.get(output_key))
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
        limit = int(routing_settings.MAX_RESPONSE_BYTES)
        try:
            with self.client.stream(
                "POST", url, json=payload, headers=dict(headers), timeout=timeouts
            ) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limit:
                    raise ResponseError(
                        f"The provider's response is larger than {limit} bytes.",
                        http_status=response.status_code,
                    )
                return response.status_code, response.headers, _read_limited(response, deadline)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            # ``from None``: the httpx exception carries the URL and request; only the
            # classified, key-free error escapes.
            raise from_httpx_exception(exc) from None
        except RuntimeError:
            # The registry closed this client (the provider row changed) mid-call.
            if self._client is None or self._client.is_closed:
                raise NetworkError("The HTTP client was closed during the call.") from None
            raise

    # --- streaming ------------------------------------------------------------------
    def stream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> Iterator[StreamEvent]:
        """Stream natively over SSE (see :mod:`llm_routing.providers.streaming`).

        Pre-first-token failures raise (the router may still fail over); a body that
        ends without a finish reason ends the generator without a StreamEnd (the
        router reports the cut); a malformed event is skipped and logged; a
        structured answer is validated once complete.
        """
        decoder = self.stream_decoder(request)
        if decoder is None:  # a subclass without a native stream: answer in one piece
            yield from super().stream(request, api_key=api_key, timeout=timeout)
            return
        overall = max(0.001, min(float(self.config.timeout_s), float(timeout)))
        first_token = max(0.001, min(float(self.config.first_token_timeout_s), overall))
        idle = max(0.001, float(routing_settings.STREAM_IDLE_TIMEOUT_S))
        base = self.timeouts(timeout)
        # Headers are waited for under the first-token timeout; body reads get a socket
        # backstop below; the watchdog enforces the exact per-phase deadlines.
        timeouts = httpx.Timeout(
            connect=base.connect, read=first_token, write=overall, pool=base.pool
        )
        clock = StreamClock(first_token_s=first_token, idle_s=idle, overall_s=overall)
        payload = self.stream_payload(request)
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            **self.auth_headers(api_key),
        }
        limit = int(routing_settings.MAX_RESPONSE_BYTES)
        end: StreamEnd | None = None
        try:
            clock.waiting()
            with self.client.stream(
                "POST",
                self.stream_endpoint(request),
                json=payload,
                headers=headers,
                timeout=timeouts,
            ) as response:
                status = response.status_code
                if status != 200 or not _is_event_stream(response):
                    body = _read_limited(response, clock.overall_at)
                    yield from self._answer_in_one_piece(request, status, response.headers, body)
                    return
                clock.attach(response)
                _set_body_read_timeout(response, min(max(first_token, idle), overall))
                skipped = 0
                for event in EventSource(response).iter_sse():
                    clock.waiting()  # an event is not silence: the idle clock restarts
                    if response.num_bytes_downloaded > limit:
                        raise ResponseError(
                            f"The provider's stream is larger than {limit} bytes.",
                            http_status=status,
                        )
                    try:
                        items = decoder.feed(event)
                    except ProviderError as exc:
                        # An in-band error is raised after the commit point too, where
                        # no retry layer scrubs it: its vendor message may echo the key.
                        raise _scrubbed(exc, api_key) from None
                    except MalformedEvent:
                        skipped += 1
                        logger.warning(
                            "Skipped a malformed stream event from %s (%d bytes, #%d)",
                            self.config.name,
                            len(event.data),
                            skipped,
                        )
                        if skipped > self.max_skipped_events:
                            raise ResponseError(
                                "The provider's stream has too many malformed events."
                            ) from None
                        continue
                    for item in items:
                        clock.got_token()
                        clock.paused()
                        if isinstance(item, str):
                            yield StreamDelta(item)
                        else:
                            yield StreamToolCallDelta(item)
                        clock.waiting()
                    if decoder.done:
                        break
                if clock.expired and not decoder.done:  # an end marker beats a late alarm
                    raise clock.error()
                end = decoder.end()
                # A tool-call answer carries no structured text to validate.
                if (
                    end is not None
                    and request.response_schema is not None
                    and (decoder.text or not end.tool_calls)
                ):
                    validate_structured(decoder.text, request.response_schema)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            if clock.expired:
                raise clock.error() from None
            raise from_httpx_exception(exc) from None
        except RuntimeError:
            if self._client is None or self._client.is_closed:
                raise NetworkError("The HTTP client was closed during the call.") from None
            raise
        finally:
            clock.close()
        # The connection is released before the end reaches the consumer.
        if end is not None:
            yield end

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
    ) -> ProviderResult:
        return ProviderResult(
            provider=self.config.name,
            model=str(model) if isinstance(model, str) and model else self.config.model,
            mode="live",
            status="ok",
            output=output,
            data=data,
            usage=Usage(input_tokens=_int(input_tokens), output_tokens=_int(output_tokens)),
            finish_reason=str(finish_reason) if finish_reason is not None else None,
            tool_calls=tool_calls,
        )


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


def _read_limited(response: httpx.Response, deadline: float) -> bytes:
    """The body, cut at ``MAX_RESPONSE_BYTES`` and abandoned after ``deadline``."""
    limit = int(routing_settings.MAX_RESPONSE_BYTES)
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise ResponseError(
                f"The provider's response is larger than {limit} bytes.",
                http_status=response.status_code,
            )
        if time.monotonic() > deadline:
            raise ProviderTimeoutError("The provider did not finish its answer in time.")
        chunks.append(chunk)
    return b"".join(chunks)


def _scrubbed(exc: ProviderError, api_key: str | None) -> ProviderError:
    from ..logging import known_key_values

    exc.message = scrub(exc.message, (api_key, *known_key_values()))
    exc.args = (exc.message,)
    return exc


def _is_event_stream(response: httpx.Response) -> bool:
    return "text/event-stream" in response.headers.get("content-type", "").lower()


def _set_body_read_timeout(response: httpx.Response, seconds: float) -> None:
    """The per-read socket timeout of the body (httpcore reads it when the body starts):
    a backstop behind the watchdog, long enough for either phase."""
    timeout = response.request.extensions.get("timeout")
    if isinstance(timeout, dict):
        timeout["read"] = seconds


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


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _version() -> str:
    from ..version import __version__

    return __version__
