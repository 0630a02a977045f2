"""Logs that join up: every line written while serving a request carries its id, and
every 5xx is logged with its traceback and request id under the shipped settings with
DEBUG off (tests.settings is the demo project's, DEBUG false)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path
from rest_framework.test import APIClient

from llm_routing.logging import JsonFormatter, RequestIdFilter
from tests.support import clean_env, python

pytestmark = pytest.mark.django_db


def crash(request: HttpRequest) -> HttpResponse:
    logging.getLogger("llm_routing.tests").warning("about to fail")
    raise RuntimeError("boom in the view")


urlpatterns = [path("crash/", crash)]


@pytest.fixture
def console() -> Iterator[io.StringIO]:
    """The shipped console handler (on llm_routing and django.request), writing here."""
    handler = logging.getLogger("django.request").handlers[0]
    assert handler in logging.getLogger("llm_routing").handlers
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    old = handler.setStream(stream)
    try:
        yield stream
    finally:
        handler.setStream(old)


def test_every_line_of_a_routed_request_carries_its_id(
    api: APIClient, console: io.StringIO
) -> None:
    response = api.post("/audit/", {"task": "t", "input_text": "x"}, format="json")
    assert response.status_code == 200
    request_id = response.json()["request_id"]
    assert response["X-Request-ID"] == request_id
    lines = [line for line in console.getvalue().splitlines() if line]
    assert any("llm_routing.router" in line and "routed" in line for line in lines)
    assert lines and all(f"[{request_id}]" in line for line in lines), lines


def test_a_streamed_request_logs_with_its_id(api: APIClient, console: io.StringIO) -> None:
    response = api.post("/audit/", {"task": "t", "input_text": "x", "stream": True}, format="json")
    assert response.status_code == 200
    body = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    request_id = response["X-Request-ID"]
    assert f'"request_id":"{request_id}"' in body
    lines = [line for line in console.getvalue().splitlines() if line]
    assert any("routed" in line for line in lines)
    assert all(f"[{request_id}]" in line for line in lines), lines


@override_settings(ROOT_URLCONF=__name__, DEBUG=False)
def test_a_500_is_logged_with_traceback_and_request_id(console: io.StringIO) -> None:
    client = Client(raise_request_exception=False)
    response = client.get("/crash/")
    assert response.status_code == 500
    request_id = response["X-Request-ID"]
    text = console.getvalue()
    assert f"ERROR django.request [{request_id}] Internal Server Error: /crash/" in text
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: boom in the view" in text
    assert f"WARNING llm_routing.tests [{request_id}] about to fail" in text


@override_settings(ROOT_URLCONF=__name__, DEBUG=False)
def test_json_format_carries_the_id_and_the_traceback() -> None:
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    try:
        response = Client(raise_request_exception=False).get("/crash/")
    finally:
        logger.removeHandler(handler)
    assert isinstance(handler.stream, io.StringIO)
    (line,) = handler.stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and record["logger"] == "django.request"
    assert record["request_id"] == response["X-Request-ID"]
    assert "RuntimeError: boom in the view" in record["exc_info"]
    assert record["message"] == "Internal Server Error: /crash/"


def test_outside_a_request_the_id_is_a_dash() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    RequestIdFilter().filter(record)
    assert record.request_id == "-"  # type: ignore[attr-defined]
    assert json.loads(JsonFormatter().format(record))["request_id"] == "-"


@pytest.mark.parametrize("value, formatter", [("json", "json"), ("", "plain")])
def test_log_format_selects_the_formatter(value: str, formatter: str) -> None:
    code = (
        "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'project.settings');"
        "from django.conf import settings;"
        "print(settings.LOGGING['handlers']['console']['formatter'])"
    )
    env = (
        clean_env(SECRET_KEY="x" * 50, LOG_FORMAT=value)
        if value
        else clean_env(SECRET_KEY="x" * 50)
    )
    done = python("-c", code, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == formatter


async def async_crash(request: HttpRequest) -> HttpResponse:
    logging.getLogger("llm_routing.tests").warning("async view about to fail")
    raise RuntimeError("boom in the async view")


async def async_stream(request: HttpRequest) -> StreamingHttpResponse:
    async def body() -> AsyncIterator[bytes]:
        for part in (b"a", b"b"):
            logging.getLogger("llm_routing.tests").warning("streaming %s", part.decode())
            yield part

    return StreamingHttpResponse(body())


urlpatterns += [path("async-crash/", async_crash), path("async-stream/", async_stream)]


@override_settings(ROOT_URLCONF=__name__, DEBUG=False)
def test_under_asgi_the_id_is_on_every_line(console: io.StringIO) -> None:
    async def run() -> tuple[str, str]:
        client = AsyncClient(raise_request_exception=False)
        response = await client.get("/async-crash/")
        assert response.status_code == 500
        streamed = await client.get("/async-stream/")
        body = b"".join([c async for c in streamed.streaming_content])  # type: ignore[attr-defined]
        assert body == b"ab"
        return response["X-Request-ID"], streamed["X-Request-ID"]

    request_id, stream_id = async_to_sync(run)()
    text = console.getvalue()
    assert f"WARNING llm_routing.tests [{request_id}] async view about to fail" in text
    assert f"ERROR django.request [{request_id}] Internal Server Error: /async-crash/" in text
    assert "RuntimeError: boom in the async view" in text
    assert f"[{stream_id}] streaming a" in text and f"[{stream_id}] streaming b" in text
