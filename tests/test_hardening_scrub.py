"""Issue 11, part B (item 11) — key values are scrubbed from every answer, not only from
errors: an upstream that echoes the key in its content, structured data or model name
never gets it to the caller, ``AuditJob.result`` or ``llm_routing_audit``; the caller's
input echoed inside an upstream error message is scrubbed from the stored job result and
the envelope. Over real HTTP to the fake upstream (tests/fakes/upstream.py)."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from llm_routing.models import AuditJob, Provider
from llm_routing.router import route_stream
from llm_routing.types import AuditRequest, StreamChunk, StreamResult
from tests.conftest import ScriptedProvider, make_chain, make_provider, upstream_fields
from tests.fakes.upstream import FakeUpstream, Fault

pytestmark = pytest.mark.django_db

KEY = "sk-scrub-canary-9f8e7d6c5b4a39281706"
INPUT = "Please review the quarterly numbers for ACME-4471 before Friday."


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", KEY)


@pytest.fixture
def oc(fake_upstream: FakeUpstream) -> Provider:
    row = Provider.objects.create(**upstream_fields("oc", "openai_compatible", fake_upstream))
    make_chain("main", [row], is_default=True)
    return row


def echoing_answer(content: str) -> Fault:
    """A healthy 200 whose content and model name carry the key the request sent."""
    return Fault(
        body={
            "id": "chatcmpl-echo",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": f"echo-{KEY}",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
        }
    )


def input_echoing_error() -> Fault:
    return Fault(
        status=400,
        body={
            "error": {
                "message": f"Invalid 'messages[0].content': {json.dumps(INPUT)} is not allowed.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": None,
            }
        },
    )


def test_the_caller_never_sees_an_echoed_key(
    api: APIClient, fake_upstream: FakeUpstream, oc: Provider
) -> None:
    fake_upstream.script("openai", echoing_answer(f"Your key is {KEY}."))
    resp = api.post("/audit/", {"task": "t", "input_text": INPUT}, format="json")
    assert resp.status_code == 200
    assert fake_upstream.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was sent
    body = resp.content.decode()
    assert KEY not in body and KEY not in str(resp.headers)
    assert resp.json()["result"]["output"] == "Your key is [redacted]."

    fake_upstream.script("openai", echoing_answer(f"again {KEY}"))
    messages = [{"role": "user", "content": "hi"}]
    resp = api.post("/v1/chat/completions", {"model": "main", "messages": messages}, "json")
    assert resp.status_code == 200
    assert KEY not in resp.content.decode() and KEY not in str(resp.headers)
    assert resp.json()["model"] == "echo-[redacted]"


def test_structured_data_is_scrubbed(
    api: APIClient, fake_upstream: FakeUpstream, oc: Provider
) -> None:
    fake_upstream.script("openai", echoing_answer(json.dumps({"note": KEY, KEY: "as a key"})))
    schema = {"type": "object"}
    resp = api.post(
        "/audit/", {"task": "t", "input_text": INPUT, "response_schema": schema}, format="json"
    )
    assert resp.status_code == 200
    assert resp.json()["result"]["data"] == {"note": "[redacted]", "[redacted]": "as a key"}
    assert KEY not in resp.content.decode()


def test_job_results_and_the_audit_command_never_hold_the_key_or_echoed_input(
    api: APIClient,
    fake_upstream: FakeUpstream,
    oc: Provider,
    django_capture_on_commit_callbacks: Any,
) -> None:
    fake_upstream.script("openai", echoing_answer(f"key {KEY}"), input_echoing_error())
    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            resp = api.post(
                "/audit/", {"task": "t", "input_text": INPUT, "async": True}, format="json"
            )
        assert resp.status_code == 202
    ok, failed = AuditJob.objects.order_by("created_at")
    assert ok.status == failed.status == "done"
    assert ok.result["result"]["output"] == "key [redacted]"
    stored = json.dumps([ok.result, failed.result])
    assert KEY not in stored and INPUT not in stored and json.dumps(INPUT) not in stored
    error = failed.result["result"]["error"]
    assert error["category"] == "invalid_request" and "[redacted]" in error["message"]
    polled = api.get(resp.json()["status_url"]).content.decode()
    assert INPUT not in polled

    fake_upstream.script("openai", echoing_answer(f"cli {KEY}"), input_echoing_error())
    printed = []
    for flags in ([], ["--json"]):
        out = StringIO()
        call_command("llm_routing_audit", "--task", "t", "--input", INPUT, *flags, stdout=out)
        printed.append(out.getvalue())
    assert "output:      cli [redacted]" in printed[0]
    assert '"category": "invalid_request"' in printed[1]
    assert all(KEY not in text and INPUT not in text for text in printed)


def test_the_synchronous_envelope_does_not_echo_the_input(
    api: APIClient, fake_upstream: FakeUpstream, oc: Provider
) -> None:
    fake_upstream.script("openai", input_echoing_error())
    resp = api.post("/audit/", {"task": "t", "input_text": INPUT}, format="json")
    assert resp.status_code == 200
    assert resp.json()["result"]["error"]["category"] == "invalid_request"
    assert INPUT not in resp.content.decode()


def test_a_key_split_across_stream_chunks_is_scrubbed(
    scripted: type[ScriptedProvider],
) -> None:
    make_chain("main", [make_provider("a", supports_streaming=True)], is_default=True)
    scripted.streams["a"] = [["it is ", KEY[:9], KEY[9:20], KEY[20:] + " ok", " sk", "!", "END"]]
    events = list(route_stream(AuditRequest(task="t", input_text="x", stream=True)))
    text = "".join(e.text for e in events if isinstance(e, StreamChunk))
    assert text == "it is [redacted] ok sk!"
    assert isinstance(events[-1], StreamResult)
    assert events[-1].routed.result.output == text


def test_tool_call_arguments_echoing_the_key_are_scrubbed(
    api: APIClient, fake_upstream: FakeUpstream, oc: Provider
) -> None:
    """A tool-call answer is an answer too: a key echoed in a call's arguments never
    reaches the caller (nor the job rows: the same sanitized result is recorded)."""
    call = {"id": "call_k", "name": "lookup", "arguments": {"token": KEY, "q": "x"}}
    fake_upstream.script("openai", Fault(tool_calls=[call]))
    tool = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object"}},
    }
    resp = api.post(
        "/audit/",
        {"task": "t", "messages": [{"role": "user", "content": INPUT}], "tools": [tool]},
        format="json",
    )
    assert resp.status_code == 200, resp.content
    calls = resp.json()["result"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["lookup"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"token": "[redacted]", "q": "x"}
    assert KEY not in resp.content.decode()
