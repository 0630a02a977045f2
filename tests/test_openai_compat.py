"""The OpenAI-compatible face, driven by the official ``openai`` SDK over a live server."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from rest_framework.authtoken.models import Token

from llm_routing.errors import AuthenticationError, ContentPolicyError, NetworkError
from llm_routing.models import Chain, ChainEntry, RoutingDecision, RoutingRule

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(django_user_model) -> str:
    user = django_user_model.objects.create_user(username="sdk", password="pw-sdk-123")
    return Token.objects.create(user=user).key


@pytest.fixture
def client(live_server, token):
    # Closed after the test, so no keep-alive connection outlives it in a server thread.
    with openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=token, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def chain(scripted, key_env):
    a = make_provider("a", supports_streaming=True, supports_structured_output=True, max_retries=0)
    b = make_provider("b", supports_streaming=True, model="b-served-model")
    c = make_chain("main", [a, b], is_default=True)
    return scripted, c


MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Say hello."},
]


def test_non_stream_completion(client, chain):
    completion = client.chat.completions.create(model="main", messages=MESSAGES)
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content == "answer from a"
    assert completion.choices[0].message.role == "assistant"
    assert completion.model == "a-model"  # the model that served, never the chain name
    assert completion.usage.prompt_tokens == 3 and completion.usage.completion_tokens == 4
    decision = RoutingDecision.objects.get()
    assert completion.id == "chatcmpl-" + str(decision.request_id).replace("-", "")


def test_headers_name_request_provider_and_attempts(client, chain):
    raw = client.chat.completions.with_raw_response.create(model="main", messages=MESSAGES)
    assert raw.headers["x-llm-provider"] == "a"
    assert raw.headers["x-llm-attempts"] == "1"
    assert raw.headers["x-request-id"] == str(RoutingDecision.objects.get().request_id)


def test_failover_reports_the_serving_model(client, chain):
    scripted, _ = chain
    scripted.scripts["a"] = [NetworkError("reset")]
    completion = client.chat.completions.create(model="main", messages=MESSAGES)
    assert completion.model == "b-served-model"
    assert completion.choices[0].message.content == "answer from b"


def test_model_selects_route_and_provider(client, chain):
    c = make_provider("c")
    RoutingRule.objects.create(name="vis", route="vision", chain=make_chain("vis-chain", [c]))
    assert client.chat.completions.create(model="vision", messages=MESSAGES).model == "c-model"
    assert client.chat.completions.create(model="b", messages=MESSAGES).model == "b-served-model"
    assert client.chat.completions.create(model="mock", messages=MESSAGES).model == "mock-1"


def test_unknown_model_is_404_not_found_error(client, chain):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=MESSAGES)
    assert "nope" in info.value.message


def test_stream_delivers_chunks_and_usage(client, chain):
    scripted, _ = chain
    scripted.streams["a"] = [["Hel", "lo", "!", "END"]]
    stream = client.chat.completions.create(
        model="main", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello!"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert {c.model for c in chunks} == {"a-model"}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and finishes.count("stop") == 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert chunks[0].choices[0].delta.role == "assistant"


def test_stream_cut_mid_answer_raises_in_band_error(client, chain):
    scripted, _ = chain
    scripted.streams["a"] = [["partial ", "text ", NetworkError("reset")]]
    received: list[str] = []
    with pytest.raises(openai.APIError) as info:
        for c in client.chat.completions.create(model="main", messages=MESSAGES, stream=True):
            if c.choices:
                received.append(c.choices[0].delta.content or "")
    assert "".join(received) == "partial text "
    assert info.value.code == "network"
    assert [n for n, _ in scripted.calls] == ["a"]  # no replay from b


def test_stream_pre_commit_failure_fails_over(client, chain):
    scripted, _ = chain
    scripted.streams["a"] = [[NetworkError("reset")]]
    scripted.streams["b"] = [["from b", "END"]]
    chunks = list(client.chat.completions.create(model="main", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "from b"
    assert {c.model for c in chunks} == {"b-served-model"}


def test_structured_output_json_schema(client, scripted, key_env):
    make_chain("mockonly", [], is_default=True)
    schema = {
        "type": "object",
        "properties": {"title": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["title", "n"],
        "additionalProperties": False,
    }
    completion = client.chat.completions.create(
        model="mock",
        messages=MESSAGES,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
    )
    assert json.loads(completion.choices[0].message.content) == {"n": 0, "title": "mock"}


def test_upstream_auth_failure_is_502_api_error(client, chain):
    scripted, _ = chain
    scripted.scripts["a"] = [AuthenticationError("bad upstream key", http_status=401)]
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="main", messages=MESSAGES)
    assert info.value.status_code == 502
    assert info.value.code == "upstream_authentication"


def test_content_policy_is_400_without_failover(client, chain):
    scripted, _ = chain
    scripted.scripts["a"] = [ContentPolicyError("refused", http_status=400)]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="main", messages=MESSAGES)
    assert info.value.code == "content_policy_violation"
    assert [n for n, _ in scripted.calls] == ["a"]


def test_disabled_provider_as_model_is_a_503_not_a_mock_answer(client, chain):
    Chain.objects.update(is_default=False)
    off = make_provider("off", enabled=False)
    # In a chain the caller may use: naming it needs no permission.
    ChainEntry.objects.create(chain=Chain.objects.get(name="main"), provider=off, position=2)
    # "off" is a provider name: explicit mode skips it; /v1 has no mock backstop.
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="off", messages=MESSAGES)
    assert info.value.status_code == 503
    assert info.value.code == "no_provider_available"
    decision = RoutingDecision.objects.get()
    assert info.value.body["request_id"] == str(decision.request_id)  # type: ignore[index]
    assert info.value.body["candidates"] == [  # type: ignore[index]
        {"provider": "off", "outcome": "skipped", "reason": "disabled"}
    ]


def test_bad_token_is_authentication_error(live_server, chain):
    bad = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.chat.completions.create(model="main", messages=MESSAGES)
    assert info.value.status_code == 401


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "main", "messages": []}, "messages"),
        ({"model": "main", "messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ({"model": "main", "messages": [{"role": "system", "content": "only system"}]}, "messages"),
        ({"model": "main", "messages": MESSAGES, "temperature": 9}, "temperature"),
        ({"model": "main", "messages": MESSAGES, "n": 2}, "n"),
        ({"messages": MESSAGES}, "model"),
    ],
)
def test_invalid_requests_are_400_in_openai_envelope(live_server, token, chain, body, param):
    response = httpx.post(
        f"{live_server.url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"].startswith(param)


def test_models_lists_chains_routes_providers(client, chain):
    RoutingRule.objects.create(name="vis", route="vision", chain=chain[1])
    ids = {m.id: m.owned_by for m in client.models.list()}
    assert ids["main"] == "chain" and ids["vision"] == "route"
    assert ids["a"] == "provider" and ids["mock"] == "provider"


def test_audit_stream_sse_events(live_server, token, chain):
    scripted, _ = chain
    scripted.streams["a"] = [["one ", "two", "END"]]
    with httpx.stream(
        "POST",
        f"{live_server.url}/audit/",
        json={"task": "t", "input_text": "x", "stream": True},
        headers={"Authorization": f"Token {token}"},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        body = response.read().decode()
    events = [
        (block.split("\n")[0].removeprefix("event: "), json.loads(block.split("data: ", 1)[1]))
        for block in body.strip().split("\n\n")
    ]
    assert [e for e, _ in events] == ["chunk", "chunk", "result"]
    assert "".join(d["text"] for e, d in events if e == "chunk") == "one two"
    envelope = events[-1][1]
    assert envelope["result"]["output"] == "one two"
    assert envelope["routing_metadata"]["selected_provider"] == "a"


def test_audit_stream_mid_failure_ends_with_error_event(live_server, token, chain):
    scripted, _ = chain
    scripted.streams["a"] = [["one ", NetworkError("reset")]]
    response = httpx.post(
        f"{live_server.url}/audit/",
        json={"task": "t", "input_text": "x", "stream": True},
        headers={"Authorization": f"Token {token}"},
    )
    blocks = response.text.strip().split("\n\n")
    assert blocks[-1].startswith("event: error")
    error = json.loads(blocks[-1].split("data: ", 1)[1])
    assert error["partial"] is True and error["category"] == "network"
    assert not any(b.startswith("event: result") for b in blocks)
