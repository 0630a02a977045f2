"""Consistent answers across the faces of the router: the mode recorded for a chain named
on ``/v1``, a streamed structured answer, SSE clients' ``Accept`` header, and validation
messages that say what they expect."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from llm_routing.models import RoutingDecision
from llm_routing.types import RouterMode

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "score": {"type": "integer"}},
    "required": ["title", "score"],
}


def sse_events(body: bytes) -> list[tuple[str, Any]]:
    events = []
    for block in body.decode().strip().split("\n\n"):
        head, data = block.split("\n", 1)
        events.append((head.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def streamed(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def test_a_chain_named_on_v1_is_recorded_as_mode_chain(api: APIClient, scripted, key_env) -> None:
    make_chain("default", [make_provider("a")], is_default=True)
    response = api.post(
        "/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": "Hi"}]},
        format="json",
    )
    assert response.status_code == 200, response.content
    decision = RoutingDecision.objects.get()
    assert decision.router_mode == "chain"
    assert decision.requested_provider in (None, "")
    assert decision.chain_name == "default"
    # Every recorded mode is one the API reference documents.
    assert decision.router_mode in RouterMode.__args__


def test_an_explicit_provider_is_still_mode_explicit(api: APIClient, scripted, key_env) -> None:
    make_chain("main", [make_provider("a"), make_provider("b")], is_default=True)
    response = api.post("/audit/", {"task": "t", "input_text": "x", "provider": "b"}, format="json")
    assert response.json()["routing_metadata"]["router_mode"] == "explicit"
    assert response.json()["routing_metadata"]["requested_provider"] == "b"


def test_streamed_structured_answer_ends_with_the_parsed_data(api: APIClient) -> None:
    body = {"task": "extract", "input_text": "Django", "response_schema": SCHEMA}
    plain = api.post("/audit/", body, format="json").json()["result"]
    assert isinstance(plain["data"], dict) and set(plain["data"]) == {"title", "score"}

    response = api.post("/audit/", {**body, "stream": True}, format="json")
    events = sse_events(streamed(response))
    assert events[-1][0] == "result"
    result = events[-1][1]["result"]
    assert result["data"] == plain["data"]
    assert json.loads("".join(d["text"] for e, d in events if e == "chunk")) == plain["data"]


def test_stream_without_schema_keeps_data_null(api: APIClient) -> None:
    response = api.post("/audit/", {"task": "t", "input_text": "x", "stream": True}, format="json")
    assert sse_events(streamed(response))[-1][1]["result"]["data"] is None


def test_sse_accept_header_gets_the_stream(api: APIClient) -> None:
    response = api.post(
        "/audit/",
        {"task": "t", "input_text": "x", "stream": True},
        format="json",
        HTTP_ACCEPT="text/event-stream",
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    assert [e for e, _ in sse_events(streamed(response))][-1] == "result"


def test_sse_accept_header_on_bad_input_is_a_json_400(api: APIClient) -> None:
    response = api.post(
        "/audit/", {"task": "t", "stream": True}, format="json", HTTP_ACCEPT="text/event-stream"
    )
    assert response.status_code == 400
    assert "input_text" in response.json()


def test_unacceptable_accept_header_is_still_406(api: APIClient) -> None:
    response = api.post(
        "/audit/", {"task": "t", "input_text": "x"}, format="json", HTTP_ACCEPT="image/png"
    )
    assert response.status_code == 406


@pytest.mark.parametrize("field", ["task", "provider", "route", "force_provider"])
def test_slug_errors_name_the_pattern_and_an_example(api: APIClient, field: str) -> None:
    body: dict[str, Any] = {"task": "t", "input_text": "x", field: "not a slug!"}
    response = api.post("/audit/", body, format="json")
    assert response.status_code == 400
    message = response.json()[field][0]
    assert "^[-a-zA-Z0-9_]+$" in message
    assert '"summarize"' in message
