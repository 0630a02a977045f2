"""The fake upstream itself: request log, routing, SSE endpoints (for issue 5)."""

from __future__ import annotations

import httpx
import pytest
from httpx_sse import connect_sse

from tests.fakes.upstream import FakeUpstream, Faults


def test_request_log_and_unknown_paths(fake_upstream: FakeUpstream) -> None:
    with httpx.Client(base_url=fake_upstream.url) as client:
        assert client.post("/nope", json={}).status_code == 404
        assert client.get("/v1/chat/completions").status_code == 404
        ok = client.post("/v1/chat/completions", json={"model": "m", "messages": []})
    assert ok.status_code == 200 and ok.json()["object"] == "chat.completion"
    assert [r.vendor for r in fake_upstream.requests] == ["unknown", "openai"]
    assert fake_upstream.requests[1].json == {"model": "m", "messages": []}


def test_faults_are_consumed_in_order_per_vendor(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("anthropic", Faults.overloaded(), Faults.rate_limit("anthropic"))
    with httpx.Client(base_url=fake_upstream.url) as client:
        statuses = [client.post("/v1/messages", json={"model": "m"}).status_code for _ in range(3)]
        assert client.post("/v1/chat/completions", json={}).status_code == 200
    assert statuses == [529, 429, 200]
    with pytest.raises(ValueError):
        fake_upstream.script("cohere", Faults.ok())


@pytest.mark.parametrize(
    "path, body, last_data",
    [
        ("/v1/chat/completions", {"model": "m", "stream": True}, "[DONE]"),
        ("/v1/messages", {"model": "m", "stream": True}, '{"type": "message_stop"}'),
        ("/v1beta/models/g:streamGenerateContent?alt=sse", {}, None),
    ],
)
def test_sse_streams(
    path: str, body: dict[str, object], last_data: str | None, fake_upstream: FakeUpstream
) -> None:
    with (
        httpx.Client(base_url=fake_upstream.url) as client,
        connect_sse(client, "POST", path, json=body) as source,
    ):
        events = list(source.iter_sse())
    assert len(events) > 3
    if last_data is not None:
        assert events[-1].data == last_data
    else:
        assert events[-1].json()["candidates"][0]["finishReason"] == "STOP"
