"""The async upstream transport setting (``LLM_ROUTING["ASYNC_HTTP_TRANSPORT"]``) and the
aiohttp wrapper of :mod:`llm_routing.providers.aio`.

Real HTTP to local servers: the setting picks the client; aiohttp's failures reach the
taxonomy as httpcore's do (a server disconnect is a network error, not a timeout); an
upload the server never reads times out on both transports instead of hanging; TLS is
verified with the one shared context; a client whose loop is gone is dropped without
aiohttp's "Unclosed client session" log; a missing package falls back to httpcore with
a warning, and an unknown value is check E006. The adapter test matrix itself runs on
both transports in tests/test_providers_async.py and tests/test_providers_faults.py.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from django.test import override_settings

from llm_routing import checks, errors
from llm_routing.providers import aio
from llm_routing.providers.base import HttpProvider, ShardedAsyncTransport, shared_ssl_context
from llm_routing.providers.classify import from_httpx_exception
from llm_routing.types import AuditRequest
from tests.fakes.tls import self_signed_server as tls_server
from tests.fakes.upstream import FakeUpstream

KEY = "sk-aio-KEY-0a1b2c3d4e5f"
REQUEST = AuditRequest(task="t", input_text="Say it.", instructions="Be brief.")
MakeAdapter = Callable[..., HttpProvider]


def call(adapter: HttpProvider, request: AuditRequest = REQUEST, timeout: float = 5.0) -> Any:
    """One ``acomplete`` on a fresh loop, bounded so a hang fails instead of blocking."""

    async def go() -> Any:
        try:
            async with asyncio.timeout(20):
                return await adapter.acomplete(request, api_key=KEY, timeout=timeout)
        finally:
            await adapter.aclose()

    return asyncio.run(go())


# --- the setting ---------------------------------------------------------------------------
def test_the_setting_picks_the_async_client(
    async_transport: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    adapter = make_adapter("openai")

    async def go() -> httpx.AsyncClient:
        client = adapter.aclient
        assert (await adapter.acomplete(REQUEST, api_key=KEY, timeout=5.0)).ok
        await adapter.aclose()
        return client

    client = asyncio.run(go())
    if async_transport == "aiohttp":
        assert isinstance(client, aio.UpstreamAsyncClient)
    else:
        assert not isinstance(client, aio.UpstreamAsyncClient)
        assert isinstance(client._transport, ShardedAsyncTransport)
    assert aio.transport_name() == async_transport
    assert checks.check_settings() == []
    # The sync client is httpcore's whatever the setting says.
    assert isinstance(adapter.client._transport, httpx.HTTPTransport)


def test_aiohttp_is_the_default() -> None:
    from llm_routing.conf import DEFAULTS

    assert DEFAULTS["ASYNC_HTTP_TRANSPORT"] == "aiohttp"
    assert aio.unavailable_reason() is None  # installed here (requirements-dev.txt)


@pytest.mark.parametrize("value", ["aiohttp ", "HTTPX", "httpcore", 1, None])
def test_an_unknown_transport_is_check_e006(value: Any) -> None:
    with override_settings(LLM_ROUTING={"ASYNC_HTTP_TRANSPORT": value}):
        found = checks.check_settings()
        assert [m.id for m in found] == ["llm_routing.E006"]
        assert repr(value) in found[0].msg
        assert aio.transport_name() == "httpx"  # httpcore serves meanwhile


@pytest.fixture
def without_httpx_aiohttp(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``import httpx_aiohttp`` fails, as when the package is not installed."""
    monkeypatch.setitem(sys.modules, "httpx_aiohttp", None)  # type: ignore[arg-type]
    monkeypatch.setattr(aio, "_warned", [])
    aio.unavailable_reason.cache_clear()
    yield
    aio.unavailable_reason.cache_clear()


def test_a_missing_package_falls_back_to_httpcore_loudly(
    without_httpx_aiohttp: None,
    make_adapter: MakeAdapter,
    fake_upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    reason = aio.unavailable_reason()
    assert reason is not None and "httpx_aiohttp" in reason
    found = checks.check_settings()
    assert [m.id for m in found] == ["llm_routing.W004"]
    assert "httpx_aiohttp" in found[0].msg
    with caplog.at_level(logging.WARNING, logger="llm_routing.providers"):
        adapter = make_adapter("openai")

        async def go() -> httpx.AsyncClient:
            client = adapter.aclient
            assert (await adapter.acomplete(REQUEST, api_key=KEY, timeout=5.0)).ok
            await adapter.aclose()
            return client

        client = asyncio.run(go())
    assert not isinstance(client, aio.UpstreamAsyncClient)  # httpcore serves, no crash
    warned = [r.getMessage() for r in caplog.records if "falls back" in r.getMessage()]
    assert len(warned) == 1 and "httpx-aiohttp" in warned[0]
    # Choosing httpcore explicitly is no warning.
    with override_settings(LLM_ROUTING={"ASYNC_HTTP_TRANSPORT": "httpx"}):
        assert checks.check_settings() == []


# --- the exception mapping ---------------------------------------------------------------
def _aiohttp_failures() -> list[tuple[str, Callable[[], BaseException], type[Exception], str]]:
    import aiohttp

    RPE, NET, TO = httpx.RemoteProtocolError, "network", "timeout"
    return [
        ("server disconnect", aiohttp.ServerDisconnectedError, RPE, NET),
        ("connect timeout", lambda: aiohttp.ConnectionTimeoutError("c"), httpx.ConnectTimeout, TO),
        ("read timeout", lambda: aiohttp.SocketTimeoutError("r"), httpx.ReadTimeout, TO),
        ("cut body", lambda: aiohttp.ClientPayloadError("cut"), RPE, NET),
        ("reset", lambda: aiohttp.ClientOSError(104, "reset"), httpx.ReadError, NET),
        ("closed", lambda: aiohttp.ClientConnectionError("closed"), httpx.ReadError, NET),
        (
            "bad scheme",
            lambda: aiohttp.NonHttpUrlClientError("ftp://x"),
            httpx.UnsupportedProtocol,
            "invalid_request",
        ),
    ]


@pytest.mark.parametrize("case", [c[0] for c in _aiohttp_failures()])
def test_aiohttp_failures_map_to_httpcores_classes(case: str) -> None:
    _, build, expected, category = next(c for c in _aiohttp_failures() if c[0] == case)
    original = build()
    for raised in (original, _wrapped_by_the_package(original)):
        mapped = aio.httpx_error_for(raised)
        assert type(mapped) is expected, case
        assert from_httpx_exception(mapped).category == category


def _wrapped_by_the_package(exc: BaseException) -> BaseException:
    """What httpx-aiohttp's own table raises for ``exc`` (its ``__cause__`` kept)."""
    from httpx_aiohttp.transport import map_aiohttp_exceptions

    try:
        with map_aiohttp_exceptions():
            raise exc
    except Exception as wrapped:
        return wrapped
    raise AssertionError("not raised")


def test_the_package_alone_would_call_a_disconnect_a_timeout() -> None:
    """Why the remapping exists: the package's table turns every connection error,
    a server disconnect included, into ``ConnectTimeout`` (the router would report a
    timeout where the server hung up)."""
    import aiohttp

    wrapped = _wrapped_by_the_package(aiohttp.ServerDisconnectedError())
    assert isinstance(wrapped, httpx.ConnectTimeout)
    assert type(aio.httpx_error_for(wrapped)) is httpx.RemoteProtocolError


def test_httpx_own_and_other_exceptions_pass_unchanged() -> None:
    assert aio.httpx_error_for(httpx.ReadTimeout("t")) is None
    assert aio.httpx_error_for(ValueError("v")) is None
    assert aio.httpx_error_for(RuntimeError("Session is closed")) is None


# --- the write phase ---------------------------------------------------------------------
@pytest.fixture
def deaf_server() -> Iterator[str]:
    """Accepts connections and never reads from them (a tiny receive buffer)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        listener.close()


def test_an_upload_the_server_never_reads_times_out(
    async_transport: str, make_adapter: MakeAdapter, deaf_server: str
) -> None:
    """httpcore applies the write timeout to each write; aiohttp has no write timeout and
    starts its read timeout only once the body is sent, so a large body to a server that
    stops reading would wait forever without the header-phase bound."""
    adapter = make_adapter("openai", base_url=deaf_server)
    big = replace(REQUEST, input_text="x" * (16 * 1024 * 1024))
    with pytest.raises(errors.ProviderTimeoutError) as caught:
        call(adapter, big, timeout=0.5)
    assert "Timeout" in caught.value.message


def test_a_large_body_the_server_reads_is_answered(
    async_transport: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    """The control of the test above: a body over ``SMALL_BODY`` goes through the
    bounded path and is answered as any other."""
    adapter = make_adapter("openai")
    big = replace(REQUEST, input_text="y" * (4 * aio.SMALL_BODY))
    result = call(adapter, big)
    assert result.ok and result.output
    (seen,) = fake_upstream.requests_for("openai")
    assert "y" * (4 * aio.SMALL_BODY) in str(seen.json)


# --- TLS -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def self_signed_server() -> Iterator[str]:
    with tls_server() as url:
        yield f"{url}/v1"


def test_tls_is_verified_with_the_shared_context(
    async_transport: str, make_adapter: MakeAdapter, self_signed_server: str
) -> None:
    adapter = make_adapter("openai", base_url=self_signed_server)
    with pytest.raises(errors.NetworkError) as caught:
        call(adapter)
    assert "ConnectError" in caught.value.message  # a certificate failure, as httpcore's
    if async_transport == "aiohttp":

        async def context() -> ssl.SSLContext:
            client = adapter.aclient
            assert isinstance(client, aio.UpstreamAsyncClient)
            return client.upstream_transport.ssl_context

        assert asyncio.run(context()) is shared_ssl_context()


# --- clients of a loop that is gone --------------------------------------------------------
@pytest.mark.parametrize("async_transport", ["aiohttp"], indirect=True)
def test_a_dropped_client_is_collected_without_an_unclosed_session_log(
    async_transport: str,
    make_adapter: MakeAdapter,
    fake_upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each ``asyncio.run`` is a new loop: the previous loop's client is dropped (it can
    no longer be closed on its loop), and the last one goes with ``close()``."""
    adapter = make_adapter("openai")

    async def one() -> None:
        assert (await adapter.acomplete(REQUEST, api_key=KEY, timeout=5.0)).ok

    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        asyncio.run(one())
        asyncio.run(one())  # the first loop's client is dropped here
        adapter.close()  # and the second one here (its loop is closed)
        gc.collect()
    unclosed = [r.getMessage() for r in caplog.records if "Unclosed" in r.getMessage()]
    assert unclosed == []
    assert adapter._aclients == {}
