"""Chat-grade requests end to end: the official ``openai`` SDK against ``/v1`` on a live
server, routed to the fake upstream speaking each vendor's wire format (openai_compatible,
anthropic, gemini). Provider rows are made with only name, kind, model, base_url and key
variable: capabilities come from the kind."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from rest_framework.authtoken.models import Token

from llm_routing.models import Provider, RoutingDecision

from .conftest import base_url_for, make_chain
from .fakes.upstream import FakeUpstream, Faults

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ("openai_compatible", "anthropic", "gemini")
VENDOR = {"openai_compatible": "openai", "anthropic": "anthropic", "gemini": "gemini"}
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
FOUR_TURNS: list[Any] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi, I live in Paris."},
    {"role": "assistant", "content": "Hello! Noted: Paris."},
    {"role": "user", "content": "Where do I live?"},
]


@pytest.fixture
def token(django_user_model) -> str:
    user = django_user_model.objects.create_user(username="e2e", password="pw-e2e-123")
    return Token.objects.create(user=user).key


@pytest.fixture
def client(live_server, token):
    with openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=token, max_retries=0) as sdk:
        yield sdk


def minimal_row(name: str, kind: str, fake: FakeUpstream) -> Provider:
    """Only what a new user fills in: name, kind, model, base_url, key variable."""
    return Provider.objects.create(
        name=name,
        kind=kind,
        model=f"{kind}-model",
        base_url=base_url_for(kind, fake),
        api_key_env="TEST_PROVIDER_KEY",
    )


def upstream_turns(kind: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of the turns in the vendor's own request body, system first."""
    if VENDOR[kind] == "openai":
        return [(m["role"], m["content"]) for m in body["messages"]]
    if kind == "anthropic":
        turns = [("system", body["system"] if isinstance(body["system"], str) else "")]
        if not isinstance(body["system"], str):
            turns = [("system", "".join(b["text"] for b in body["system"]))]
        for m in body["messages"]:
            content = m["content"]
            text = content if isinstance(content, str) else "".join(b["text"] for b in content)
            turns.append((m["role"], text))
        return turns
    system = "".join(p["text"] for p in body["systemInstruction"]["parts"])
    return [("system", system)] + [
        (c["role"], "".join(p.get("text", "") for p in c["parts"])) for c in body["contents"]
    ]


EXPECTED_ROLES = {
    "openai_compatible": ["system", "user", "assistant", "user"],
    "anthropic": ["system", "user", "assistant", "user"],
    "gemini": ["system", "user", "model", "user"],
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_four_turn_conversation_arrives_as_the_vendors_message_list(
    client, fake_upstream, key_env, kind
):
    make_chain("main", [minimal_row("p", kind, fake_upstream)])
    completion = client.chat.completions.create(model="main", messages=FOUR_TURNS)
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "stop"  # end_turn / STOP normalized
    (request,) = fake_upstream.requests_for(VENDOR[kind])
    turns = upstream_turns(kind, request.json)
    assert [role for role, _ in turns] == EXPECTED_ROLES[kind]
    assert [text for _, text in turns] == [m["content"] for m in FOUR_TURNS]


def _round_trip(client: openai.OpenAI, *, stream: bool) -> tuple[Any, Any]:
    """Tool call → tool result → final answer; returns (the call, the final text)."""
    messages: list[Any] = [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    if stream:
        chunks = list(
            client.chat.completions.create(
                model="main", messages=messages, tools=[WEATHER], stream=True
            )
        )
        fragments = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
        assert fragments and all(f.index == 0 for f in fragments)
        first = fragments[0]
        assert first.id and first.function is not None and first.function.name == "get_weather"
        arguments = "".join((f.function.arguments or "") for f in fragments if f.function)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        call = {
            "id": first.id,
            "type": "function",
            "function": {"name": "get_weather", "arguments": arguments},
        }
    else:
        completion = client.chat.completions.create(
            model="main", messages=messages, tools=[WEATHER]
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        (tool_call,) = choice.message.tool_calls or []
        call = tool_call.model_dump()
    assert set(json.loads(call["function"]["arguments"])) == {"city"}
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": '{"temp_c": 21}'})
    if stream:
        chunks = list(
            client.chat.completions.create(
                model="main", messages=messages, tools=[WEATHER], stream=True
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    else:
        final = client.chat.completions.create(model="main", messages=messages, tools=[WEATHER])
        assert final.choices[0].finish_reason == "stop"
        text = final.choices[0].message.content
    return call, text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_tool_round_trip(client, fake_upstream, key_env, kind, stream):
    make_chain("main", [minimal_row("p", kind, fake_upstream)])
    call, text = _round_trip(client, stream=stream)
    assert text and text.startswith("fake answer")
    first, second = fake_upstream.requests_for(VENDOR[kind])
    body = second.json
    if VENDOR[kind] == "openai":
        assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool"]
        assert body["messages"][2]["tool_calls"][0]["id"] == call["id"]
        assert body["messages"][3]["tool_call_id"] == call["id"]
        assert body["tools"][0]["function"]["name"] == "get_weather"
    elif kind == "anthropic":
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
        (use,) = body["messages"][1]["content"]
        assert use["type"] == "tool_use" and use["id"] == call["id"]
        (result,) = body["messages"][2]["content"]
        assert result["type"] == "tool_result" and result["tool_use_id"] == call["id"]
        assert body["tools"][0]["name"] == "get_weather"
    else:
        assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
        assert body["contents"][1]["parts"][0]["functionCall"]["name"] == "get_weather"
        response = body["contents"][2]["parts"][0]["functionResponse"]
        assert response["name"] == "get_weather"
        declarations = body["tools"][0]["functionDeclarations"]
        assert declarations[0]["name"] == "get_weather"
    assert first.json != body


@pytest.mark.parametrize("kind", KINDS)
def test_a_default_row_serves_a_stream(client, fake_upstream, key_env, kind):
    row = minimal_row("p", kind, fake_upstream)
    assert row.supports_streaming is None  # inherited from the kind
    make_chain("main", [row])
    chunks = list(client.chat.completions.create(model="main", messages=FOUR_TURNS, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("fake answer")
    assert {c.model for c in chunks} == {f"{kind}-model"}
    decision = RoutingDecision.objects.get()
    assert decision.selected_provider == "p" and decision.mode == "live"
    (request,) = fake_upstream.requests_for(VENDOR[kind])
    assert request.json.get("stream") is True or request.path.endswith(":streamGenerateContent")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_failover_across_kinds_keeps_the_conversation_and_tools(
    client, fake_upstream, key_env, stream
):
    primary = minimal_row("compat", "openai_compatible", fake_upstream)
    primary.max_retries = 0
    primary.save()
    make_chain("main", [primary, minimal_row("claude", "anthropic", fake_upstream)])
    fake_upstream.script("openai", Faults.unavailable("openai", 503))
    messages = [*FOUR_TURNS[:3], {"role": "user", "content": "Weather where I live?"}]
    created = client.chat.completions.create(
        model="main",
        messages=messages,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=stream,
    )
    if stream:
        chunks = list(created)
        fragments = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
        name = fragments[0].function.name if fragments[0].function else None
        call_id = fragments[0].id
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        model = chunks[0].model
    else:
        choice = created.choices[0]
        (tool_call,) = choice.message.tool_calls or []
        name, call_id, finish, model = (
            tool_call.function.name,
            tool_call.id,
            choice.finish_reason,
            created.model,
        )
    assert (name, finish) == ("get_weather", "tool_calls")
    assert model.startswith("anthropic-model")  # the model that served
    assert call_id and call_id.startswith("toolu_")
    (failed,) = fake_upstream.requests_for("openai")
    (served,) = fake_upstream.requests_for("anthropic")
    assert [m["role"] for m in failed.json["messages"]] == ["system", "user", "assistant", "user"]
    assert failed.json["tools"][0]["function"]["name"] == "get_weather"
    body = served.json
    assert body["system"] == "You are terse." or "You are terse." in json.dumps(body["system"])
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["tools"][0]["name"] == "get_weather"
    assert body["tool_choice"] == {"type": "tool", "name": "get_weather"}
    decision = RoutingDecision.objects.get()
    assert (decision.selected_provider, decision.fallback_reason) == ("claude", "unavailable")


def test_all_candidates_skipped_is_a_503_on_v1_and_the_mock_on_audit(
    client, fake_upstream, key_env, live_server, token, monkeypatch
):
    compat = minimal_row("compat", "openai_compatible", fake_upstream)
    compat.supports_streaming = False  # this server does not stream
    compat.save()
    claude = minimal_row("claude", "anthropic", fake_upstream)
    claude.api_key_env = "LLMR_E2E_UNSET_KEY"
    claude.save()
    monkeypatch.delenv("LLMR_E2E_UNSET_KEY", raising=False)
    make_chain("main", [compat, claude], is_default=True)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="main", messages=FOUR_TURNS, stream=True)
    assert info.value.status_code == 503
    error: Any = info.value.body
    assert (error["type"], error["code"]) == ("service_unavailable", "no_provider_available")
    assert error["candidates"] == [
        {"provider": "compat", "outcome": "skipped", "reason": "unsupported"},
        {"provider": "claude", "outcome": "skipped", "reason": "missing_key"},
    ]
    assert error["request_id"] in error["message"]
    assert fake_upstream.requests_for("openai") == []

    body = {"task": "chat", "messages": FOUR_TURNS, "stream": True}
    response = httpx.post(
        f"{live_server.url}/audit/", json=body, headers={"Authorization": f"Token {token}"}
    )
    result_event = response.text.strip().split("\n\n")[-1]
    assert result_event.startswith("event: result")
    envelope = json.loads(result_event.split("data: ", 1)[1])
    assert envelope["result"]["mode"] == "mock"
    assert envelope["routing_metadata"]["skipped_providers"] == [
        {"provider": "compat", "reason": "unsupported"},
        {"provider": "claude", "reason": "missing_key"},
    ]


def test_all_candidates_failed_is_a_503_on_v1_and_chain_exhausted_on_audit(
    client, fake_upstream, key_env, live_server, token
):
    compat = minimal_row("compat", "openai_compatible", fake_upstream)
    claude = minimal_row("claude", "anthropic", fake_upstream)
    Provider.objects.update(max_retries=0)
    make_chain("main", [compat, claude], is_default=True)
    for _ in range(2):
        fake_upstream.script("openai", Faults.unavailable("openai", 503))
        fake_upstream.script("anthropic", Faults.unavailable("anthropic", 503))
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="main", messages=FOUR_TURNS)
    error: Any = info.value.body
    assert [(c["provider"], c["outcome"], c["reason"]) for c in error["candidates"]] == [
        ("compat", "error", "unavailable"),
        ("claude", "error", "unavailable"),
    ]
    envelope = httpx.post(
        f"{live_server.url}/audit/",
        json={"task": "chat", "messages": FOUR_TURNS},
        headers={"Authorization": f"Token {token}"},
    ).json()
    assert envelope["result"]["mode"] == "mock"
    assert envelope["routing_metadata"]["fallback_reason"] == "chain_exhausted"


def test_the_quickstart_chat_section_runs_as_written(fake_upstream, key_env, capsys):
    """The Python blocks of docs/quickstart.md's "Chat and tools from Python", in order,
    against a default-made anthropic row behind the chain they name."""
    from pathlib import Path

    make_chain("main", [minimal_row("claude", "anthropic", fake_upstream)])
    text = (Path(__file__).parent.parent / "docs" / "quickstart.md").read_text()
    section = text.split("## Chat and tools from Python", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    assert len(blocks) == 2
    namespace: dict[str, Any] = {}
    for block in blocks:
        exec(compile(block, "quickstart.md", "exec"), namespace)
    assert [c.name for c in namespace["calls"]] == ["get_weather"]
    assert namespace["final"].result.output.startswith("fake answer")
    assert [m["role"] for m in namespace["messages"]] == ["system", "user", "assistant", "tool"]
    assert "served by claude" in capsys.readouterr().out
    assert len(fake_upstream.requests_for("anthropic")) == 3


@pytest.mark.parametrize("kind", ["openai_compatible", "anthropic"])
def test_a_stream_cut_inside_a_tool_call_is_an_error_not_a_half_call(
    client, fake_upstream, key_env, kind
):
    make_chain(
        "main",
        [minimal_row("first", kind, fake_upstream), minimal_row("second", "gemini", fake_upstream)],
    )
    # The call's start frame, then one 8-character argument fragment, then the cut.
    fake_upstream.script(VENDOR[kind], Faults.stream(cut_after=2))
    fragments: list[Any] = []
    finishes: list[Any] = []
    with pytest.raises(openai.APIError) as info:
        for chunk in client.chat.completions.create(
            model="main", messages=FOUR_TURNS, tools=[WEATHER], stream=True
        ):
            if chunk.choices:
                fragments += chunk.choices[0].delta.tool_calls or []
                finishes.append(chunk.choices[0].finish_reason)
    assert fragments and fragments[0].function is not None
    assert fragments[0].function.name == "get_weather"  # the call had begun …
    assert finishes == [None] * len(finishes)  # … and never finished
    assert info.value.code in {"network", "response"}
    assert fake_upstream.requests_for("gemini") == []  # after the commit point: no replay
    decision = RoutingDecision.objects.get()
    assert decision.status == "error"
    attempt = decision.attempts.get(provider="first")
    assert attempt.partial is True


def test_images_skip_providers_without_the_capability(client, fake_upstream, key_env):
    make_chain(
        "main",
        [
            minimal_row("compat", "openai_compatible", fake_upstream),  # no images by default
            minimal_row("claude", "anthropic", fake_upstream),
        ],
    )
    picture: Any = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        ],
    }
    completion = client.chat.completions.create(model="main", messages=[picture])
    assert completion.model.startswith("anthropic-model")
    assert fake_upstream.requests_for("openai") == []
    (served,) = fake_upstream.requests_for("anthropic")
    blocks = served.json["messages"][0]["content"]
    assert [b["type"] for b in blocks] == ["text", "image"]
    decision = RoutingDecision.objects.get()
    skipped = decision.attempts.get(provider="compat")
    assert (skipped.outcome, skipped.reason) == ("skipped", "unsupported")
