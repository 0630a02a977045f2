"""Test helpers for the circuit breaker: a scripted local upstream and an adapter kind
that calls it over real HTTP (httpx).

Kept small on purpose: when the shared fake vendor server (tests/fakes/upstream.py)
lands, :class:`FakeUpstream` and :class:`HttpTestProvider` can be swapped for it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.filebased import FileBasedCache

from llm_routing.errors import (
    InvalidRequestError,
    NetworkError,
    ProviderTimeoutError,
    RateLimitError,
    UnavailableError,
)
from llm_routing.providers.base import BaseProvider
from llm_routing.providers.registry import register
from llm_routing.types import AuditRequest, ProviderResult

__all__ = [
    "KIND",
    "BrokenCache",
    "FakeClock",
    "FakeUpstream",
    "GatedCache",
    "HttpTestProvider",
    "install",
]

KIND = "breaker_http"


class FakeClock:
    """A wall clock that only moves when told to."""

    def __init__(self, start: float = 1_900_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeUpstream:
    """A ThreadingHTTPServer on 127.0.0.1 that counts requests and answers ``status``.

    ``hits`` holds ``clock()`` at each request (a FakeClock in tests that fake time).
    While ``release`` is clear, requests are held (up to ``hold_timeout`` seconds).
    """

    def __init__(self, *, status: int = 200, clock: Callable[[], float] = time.time) -> None:
        self.status = status
        self.retry_after: float | None = None
        self.clock = clock
        self.hits: list[float] = []
        self.release = threading.Event()
        self.release.set()
        self.hold_timeout = 60.0
        self._lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                with upstream._lock:
                    upstream.hits.append(upstream.clock())
                    status, retry_after = upstream.status, upstream.retry_after
                upstream.release.wait(upstream.hold_timeout)
                body = json.dumps(
                    {"output": "upstream answer"} if status < 400 else {"error": "scripted"}
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if retry_after is not None:
                    self.send_header("Retry-After", str(retry_after))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def requests(self) -> int:
        with self._lock:
            return len(self.hits)

    def __enter__(self) -> FakeUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class HttpTestProvider(BaseProvider):
    """POSTs to ``base_url``; 429 → RateLimitError, 5xx → UnavailableError, 4xx →
    InvalidRequestError, connect failure → NetworkError."""

    kind: ClassVar[str] = KIND
    requires_key: ClassVar[bool] = False

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._client = httpx.Client(follow_redirects=False)

    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        started = time.perf_counter()
        try:
            resp = self._client.post(
                self.config.base_url + "/complete", json={"task": request.task}, timeout=timeout
            )
        except httpx.TimeoutException as exc:
            raise ProviderTimeoutError() from exc
        except httpx.TransportError as exc:
            raise NetworkError() from exc
        status = resp.status_code
        if status == 429:
            after = resp.headers.get("Retry-After")
            raise RateLimitError(http_status=429, retry_after=float(after) if after else None)
        if status >= 500:
            raise UnavailableError(http_status=status)
        if status >= 400:
            raise InvalidRequestError(http_status=status)
        return ProviderResult(
            provider=self.config.name,
            model=self.config.model,
            mode="live",
            status="ok",
            output=resp.json()["output"],
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def close(self) -> None:
        self._client.close()


def install() -> None:
    """Register the test adapter kind through the public registry API."""
    register(KIND, HttpTestProvider)


class BrokenCache(BaseCache):
    """A cache backend whose every call fails while ``BrokenCache.broken`` is True
    (and otherwise behaves like a tiny dict cache)."""

    broken: ClassVar[bool] = True
    _data: ClassVar[dict[str, Any]] = {}

    def __init__(self, location: str, params: dict[str, Any]) -> None:
        super().__init__(params)

    def _check(self) -> None:
        if BrokenCache.broken:
            raise ConnectionError("cache at redis://:s3cret@cache.invalid:6379 refused")

    def get(self, key: str, default: Any = None, version: int | None = None) -> Any:
        self._check()
        return self._data.get(key, default)

    def set(self, key: str, value: Any, timeout: Any = None, version: int | None = None) -> None:
        self._check()
        self._data[key] = value

    def add(self, key: str, value: Any, timeout: Any = None, version: int | None = None) -> bool:
        self._check()
        if key in self._data:
            return False
        self._data[key] = value
        return True

    def delete(self, key: str, version: int | None = None) -> bool:
        self._check()
        return self._data.pop(key, None) is not None

    def get_many(self, keys: Any, version: int | None = None) -> dict[str, Any]:
        self._check()
        return {k: self._data[k] for k in keys if k in self._data}

    def clear(self) -> None:
        self._data.clear()


class GatedCache(FileBasedCache):
    """A file cache whose ``gate_at``-th async read (counted in ``reads``) sets
    ``reached`` and then waits until it is cancelled: a cancellation that lands in the
    middle of a breaker operation, at a known cache call."""

    gate_at: ClassVar[int | None] = None
    reads: ClassVar[int] = 0
    reached: ClassVar[asyncio.Event | None] = None

    async def aget(self, key: str, default: Any = None, version: int | None = None) -> Any:
        GatedCache.reads += 1
        if GatedCache.reads == GatedCache.gate_at and GatedCache.reached is not None:
            GatedCache.reached.set()
            await asyncio.Event().wait()  # until cancelled
        return await super().aget(key, default, version)
