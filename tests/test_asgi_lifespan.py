"""llm_routing.asgi.with_lifespan: the ASGI lifespan protocol answered, the adapters'
async HTTP clients closed at shutdown (when the adapters module has ``aclose_all``),
every other scope passed through."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync

from llm_routing.asgi import with_lifespan
from llm_routing.providers import registry


def drive(app: Any, scope: dict[str, Any], incoming: list[dict[str, Any]]) -> list[Any]:
    sent: list[Any] = []
    queue = list(incoming)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    async def send(message: Any) -> None:
        sent.append(message)

    async_to_sync(app)(scope, receive, send)
    return sent


async def django_would_refuse(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        raise ValueError("Django can only handle ASGI/HTTP connections, not lifespan.")
    await send({"type": "http.response.start", "status": 204, "headers": []})


LIFESPAN = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]


def test_shutdown_awaits_aclose_all(monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[str] = []

    async def aclose_all() -> None:
        closed.append("closed")

    monkeypatch.setattr(registry, "aclose_all", aclose_all)
    sent = drive(with_lifespan(django_would_refuse), {"type": "lifespan"}, LIFESPAN)
    assert sent == [{"type": "lifespan.startup.complete"}, {"type": "lifespan.shutdown.complete"}]
    assert closed == ["closed"]


def test_a_failing_close_is_logged_and_shutdown_completes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def aclose_all() -> None:
        raise OSError("socket already gone")

    monkeypatch.setattr(registry, "aclose_all", aclose_all)
    sent = drive(with_lifespan(django_would_refuse), {"type": "lifespan"}, LIFESPAN)
    assert sent[-1] == {"type": "lifespan.shutdown.complete"}
    assert "Closing the async HTTP clients failed (OSError)" in caplog.text


def test_http_goes_to_the_wrapped_application() -> None:
    sent = drive(with_lifespan(django_would_refuse), {"type": "http"}, [])
    assert sent == [{"type": "http.response.start", "status": 204, "headers": []}]


def test_shutdown_closes_the_pooled_adapters_for_real() -> None:
    from llm_routing.types import ProviderConfig

    config = ProviderConfig(name="p", kind="openai_compatible", model="m")
    adapter = registry.get_adapter(config)
    sent = drive(with_lifespan(django_would_refuse), {"type": "lifespan"}, LIFESPAN)
    assert sent[-1] == {"type": "lifespan.shutdown.complete"}
    assert registry.get_adapter(config) is not adapter  # the pool was emptied and rebuilt
