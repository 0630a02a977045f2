"""HttpProvider machinery: pooled client, timeouts, redirects, size bound (real HTTP)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import pytest
from django.test import override_settings

from llm_routing import errors
from llm_routing.providers.base import HttpProvider, read_api_key, validate_structured
from llm_routing.providers.openai import OpenAIProvider
from llm_routing.providers.registry import get_adapter
from llm_routing.types import AuditRequest, ProviderConfig
from tests.fakes.upstream import FakeUpstream, Fault

REQUEST = AuditRequest(task="t", input_text="x")


def test_one_pooled_client_reused_across_calls_and_threads(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    adapter = make_adapter("openai")
    clients: list[httpx.Client] = []

    def call() -> None:
        adapter.complete(REQUEST, api_key="k-123456", timeout=5.0)
        clients.append(adapter.client)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    call()
    assert len(clients) == 5
    assert len({id(c) for c in clients}) == 1
    assert len(fake_upstream.requests) == 5
    client = adapter.client
    adapter.close()
    assert client.is_closed
    assert adapter.client is not client  # rebuilt lazily after close


def test_client_settings(make_adapter: Callable[..., HttpProvider]) -> None:
    client = make_adapter("anthropic").client
    assert client.follow_redirects is False
    assert client.headers["user-agent"].startswith("django-llm-routing/")


@override_settings(LLM_ROUTING={"CONNECT_TIMEOUT_S": 2.0})
def test_timeouts_are_separate_and_clamped(make_adapter: Callable[..., HttpProvider]) -> None:
    adapter = make_adapter("openai", timeout_s=30.0, first_token_timeout_s=10.0)
    t = adapter.timeouts(60.0)
    assert (t.connect, t.read, t.write, t.pool) == (2.0, 30.0, 30.0, 2.0)
    t = adapter.timeouts(1.5)  # the request-wide deadline leaves 1.5 s
    assert (t.connect, t.read) == (1.5, 1.5)
    adapter = make_adapter("openai", name="o2", timeout_s=30.0, first_token_timeout_s=0.5)
    assert adapter.timeouts(60.0).connect == 0.5


def test_redirects_are_not_followed(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script(
        "openai",
        Fault(status=307, headers={"location": f"{fake_upstream.url}/elsewhere"}, body=b""),
    )
    with pytest.raises(errors.ResponseError) as caught:
        make_adapter("openai").complete(REQUEST, api_key="k-123456", timeout=5.0)
    assert caught.value.http_status == 307
    assert [r.path for r in fake_upstream.requests] == ["/v1/chat/completions"]


@override_settings(LLM_ROUTING={"MAX_RESPONSE_BYTES": 200})
def test_response_size_is_bounded(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script("openai", Fault(body={"pad": "x" * 5000}))
    with pytest.raises(errors.ResponseError) as caught:
        make_adapter("openai").complete(REQUEST, api_key="k-123456", timeout=5.0)
    assert "larger than 200 bytes" in caught.value.message


@override_settings(LLM_ROUTING={"MAX_RESPONSE_BYTES": 200})
def test_response_size_is_bounded_without_content_length() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=iter([b"{" * 150, b" " * 150]))  # chunked

    config = ProviderConfig(name="o", kind="openai", model="m", base_url="http://up.test/v1")
    adapter = OpenAIProvider(config, transport=httpx.MockTransport(handler))
    with pytest.raises(errors.ResponseError):
        adapter.complete(REQUEST, api_key="k-123456", timeout=5.0)
    adapter.close()


def test_non_200_success_status_is_a_response_error() -> None:
    config = ProviderConfig(name="o", kind="openai", model="m", base_url="http://up.test/v1")
    adapter = OpenAIProvider(config, transport=httpx.MockTransport(lambda r: httpx.Response(204)))
    with pytest.raises(errors.ResponseError) as caught:
        adapter.complete(REQUEST, api_key="k-123456", timeout=5.0)
    assert caught.value.http_status == 204


def test_non_json_error_body_is_still_classified_by_status() -> None:
    config = ProviderConfig(name="o", kind="openai", model="m", base_url="http://up.test/v1")
    adapter = OpenAIProvider(
        config,
        transport=httpx.MockTransport(lambda r: httpx.Response(502, content=b"<html>Bad gateway")),
    )
    with pytest.raises(errors.UnavailableError) as caught:
        adapter.complete(REQUEST, api_key="k-123456", timeout=5.0)
    assert caught.value.http_status == 502
    assert "<html>" not in caught.value.message


@pytest.mark.django_db
def test_registry_rebuilds_the_client_when_the_row_changes(
    fake_upstream: FakeUpstream,
) -> None:
    base = ProviderConfig(
        name="pooled", kind="openai", model="m", base_url=f"{fake_upstream.url}/v1", version="1"
    )
    first = get_adapter(base)
    assert get_adapter(base) is first
    first.complete(REQUEST, api_key="k-123456", timeout=5.0)
    assert isinstance(first, HttpProvider)
    old_client = first.client
    changed = ProviderConfig(
        name="pooled", kind="openai", model="m", base_url=f"{fake_upstream.url}/v1", version="2"
    )
    second = get_adapter(changed)
    assert second is not first
    assert old_client.is_closed


def test_read_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_PROVIDER_KEY", "value-123456")
    monkeypatch.setenv("EMPTY_PROVIDER_KEY", "")
    assert read_api_key("SOME_PROVIDER_KEY") == "value-123456"
    assert read_api_key("EMPTY_PROVIDER_KEY") is None
    assert read_api_key("") is None


def test_validate_structured() -> None:
    schema = {"type": "object", "required": ["a"]}
    assert validate_structured('{"a": 1}', schema) == {"a": 1}
    assert validate_structured({"a": 1}, None) == {"a": 1}
    with pytest.raises(errors.ResponseError):
        validate_structured("not json", schema)
    with pytest.raises(errors.ResponseError):
        validate_structured('{"b": 1}', schema)
    with pytest.raises(errors.ResponseError):
        validate_structured('{"a": 1}', {"type": 12})  # a schema jsonschema cannot use


def test_a_client_closed_mid_flight_is_a_network_error(
    make_adapter: Callable[..., HttpProvider],
) -> None:
    adapter = make_adapter("openai")
    adapter.client.close()  # as the registry does when the row changes
    with pytest.raises(errors.NetworkError):
        adapter.complete(REQUEST, api_key="k-123456", timeout=5.0)
