"""The ``/v1/messages`` (Anthropic Messages) and ``/v1/responses`` (OpenAI Responses)
faces x every vendor kind behind them, over real HTTP to the fake upstream: a whole
answer, a stream, a tool round trip (whole and streamed), failover before the first
token, a cut after the commit point ending in the face's error event, a chain whose
candidates were all skipped (503 in the face's envelope), a budget and a permission
refusing in the face's envelope, and the provider key in no answer or event."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from llm_routing.models import Budget, Provider, RoutingDecision

from .conftest import base_url_for, make_chain
from .fakes.upstream import FakeUpstream, Faults

pytestmark = pytest.mark.django_db

KINDS = ("openai", "openai_compatible", "anthropic", "gemini", "mock")
LIVE_KINDS = KINDS[:-1]  # the mock never calls a tool and cannot be cut
VENDOR = {
    "openai": "openai",
    "openai_compatible": "openai",
    "anthropic": "anthropic",
    "gemini": "gemini",
}
TEXT = "The quick brown fox jumps over the lazy dog."
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of an SSE body; every event of these faces is named."""
    events = []
    for block in raw.decode().strip().split("\n\n"):
        lines = block.split("\n")
        name = next(line[7:] for line in lines if line.startswith("event: "))
        data = "\n".join(line[6:] for line in lines if line.startswith("data: "))
        events.append((name, json.loads(data)))
    return events


class MessagesFace:
    path = "/v1/messages"
    ok_end, error_end = "message_stop", "error"
    error_types = {403: "permission_error", 429: "rate_limit_error", 503: "overloaded_error"}

    def body(self, text: str, *, tools: bool = False, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": "main",
            "max_tokens": 200,
            "messages": [{"role": "user", "content": text}],
            **extra,
        }
        if tools:
            body["tools"] = [
                {"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}
            ]
        return body

    def whole(self, body: dict[str, Any]) -> tuple[str, list[tuple[str, str, Any]], str]:
        assert body["type"] == "message" and body["role"] == "assistant"
        text = "".join(b["text"] for b in body["content"] if b["type"] == "text")
        calls = [
            (b["id"], b["name"], b["input"]) for b in body["content"] if b["type"] == "tool_use"
        ]
        return text, calls, body["stop_reason"]

    def streamed(self, events: list[tuple[str, dict[str, Any]]]) -> tuple[str, list[Any], str]:
        assert [e for e, _ in events[:2]] == ["message_start", "ping"]
        text, calls, blocks, reason = "", [], {}, ""
        for name, data in events:
            assert data["type"] == name
            if name == "content_block_start":
                blocks[data["index"]] = dict(data["content_block"], json="")
            elif name == "content_block_delta":
                delta = data["delta"]
                if delta["type"] == "text_delta":
                    text += delta["text"]
                else:
                    blocks[data["index"]]["json"] += delta["partial_json"]
            elif name == "content_block_stop":
                block = blocks[data["index"]]
                if block["type"] == "tool_use":
                    calls.append((block["id"], block["name"], json.loads(block["json"] or "{}")))
            elif name == "message_delta":
                reason = data["delta"]["stop_reason"]
        return text, calls, reason

    def tool_reason(self) -> str:
        return "tool_use"

    def follow_up(self, first: dict[str, Any], call: tuple[str, str, Any]) -> dict[str, Any]:
        body = dict(first)
        body["messages"] = [
            *first["messages"],
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call[0], "name": call[1], "input": call[2]}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call[0], "content": "21 C"}],
            },
        ]
        return body

    def error_type(self, body: dict[str, Any]) -> str:
        assert body["type"] == "error"
        return str(body["error"]["type"])


class ResponsesFace:
    path = "/v1/responses"
    ok_end, error_end = "response.completed", "response.failed"
    error_types = {403: "permission_error", 429: "rate_limit_error", 503: "service_unavailable"}

    def body(self, text: str, *, tools: bool = False, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "main", "input": text, **extra}
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": "get_weather",
                    "description": "Weather",
                    "parameters": SCHEMA,
                }
            ]
        return body

    def whole(self, body: dict[str, Any]) -> tuple[str, list[tuple[str, str, Any]], str]:
        assert body["object"] == "response" and body["store"] is False
        text = "".join(
            part["text"]
            for item in body["output"]
            if item["type"] == "message"
            for part in item["content"]
        )
        calls = [
            (i["call_id"], i["name"], json.loads(i["arguments"]))
            for i in body["output"]
            if i["type"] == "function_call"
        ]
        return text, calls, body["status"]

    def streamed(self, events: list[tuple[str, dict[str, Any]]]) -> tuple[str, list[Any], str]:
        assert [e for e, _ in events[:2]] == ["response.created", "response.in_progress"]
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        text, calls, status, args = "", [], "", ""
        for name, data in events:
            assert data["type"] == name
            if name == "response.output_text.delta":
                text += data["delta"]
            elif name == "response.function_call_arguments.delta":
                args += data["delta"]
            elif name == "response.output_item.done" and data["item"]["type"] == "function_call":
                item = data["item"]
                assert item["arguments"] == args or not args
                calls.append((item["call_id"], item["name"], json.loads(item["arguments"])))
                args = ""
            elif name in ("response.completed", "response.incomplete"):
                status = data["response"]["status"]
                assert self.whole(data["response"])[:2] == (text, calls)
        return text, calls, status

    def tool_reason(self) -> str:
        return "completed"

    def follow_up(self, first: dict[str, Any], call: tuple[str, str, Any]) -> dict[str, Any]:
        body = dict(first)
        body["input"] = [
            {"role": "user", "content": first["input"]},
            {
                "type": "function_call",
                "call_id": call[0],
                "name": call[1],
                "arguments": json.dumps(call[2]),
            },
            {"type": "function_call_output", "call_id": call[0], "output": "21 C"},
        ]
        return body

    def error_type(self, body: dict[str, Any]) -> str:
        return str(body["error"]["type"])


FACES = {"messages": MessagesFace(), "responses": ResponsesFace()}


@pytest.fixture(params=sorted(FACES))
def face(request: pytest.FixtureRequest) -> Any:
    return FACES[request.param]


def row(name: str, kind: str, fake: FakeUpstream, **fields: Any) -> Provider:
    if kind == "mock":
        return Provider.objects.create(name=name, kind="mock", model="mock-1", **fields)
    return Provider.objects.create(
        name=name,
        kind=kind,
        model=f"{kind}-model",
        base_url=base_url_for(kind, fake),
        api_key_env="TEST_PROVIDER_KEY",
        timeout_s=5.0,
        first_token_timeout_s=5.0,
        **fields,
    )


@pytest.fixture
def post(api: APIClient, key_env: str) -> Callable[..., Any]:
    """POST a face's body; asserts the provider key is in no answer or event."""

    def call(path: str, body: dict[str, Any], status: int = 200) -> Any:
        response = api.post(path, body, format="json")
        assert response.status_code == status, response.content
        if response.streaming:
            raw = b"".join(response.streaming_content)
            assert key_env.encode() not in raw
            return sse_events(raw)
        assert key_env not in response.content.decode()
        return response.json()

    return call


@pytest.mark.parametrize("kind", KINDS)
def test_a_whole_answer(face, kind, fake_upstream, post):
    make_chain("main", [row("p", kind, fake_upstream)])
    text, calls, _ = face.whole(post(face.path, face.body("Say hello.")))
    assert text and calls == []
    if kind != "mock":
        (request,) = fake_upstream.requests_for(VENDOR[kind])
        assert "Say hello." in request.body.decode()


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream(face, kind, fake_upstream, post):
    make_chain("main", [row("p", kind, fake_upstream)])
    if kind != "mock":
        fake_upstream.script(VENDOR[kind], Faults.stream(text=TEXT))
    events = post(face.path, face.body("Tell me.", stream=True))
    text, calls, _ = face.streamed(events)
    assert events[-1][0] == face.ok_end
    assert calls == [] and (text == TEXT or kind == "mock")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", LIVE_KINDS)
def test_a_tool_round_trip(face, kind, stream, fake_upstream, post):
    make_chain("main", [row("p", kind, fake_upstream)])
    first = face.body("Weather in Paris?", tools=True, stream=stream)
    answer = post(face.path, first)
    _, calls, reason = face.streamed(answer) if stream else face.whole(answer)
    ((call_id, name, arguments),) = calls
    assert call_id and name == "get_weather" and set(arguments) == {"city"}
    assert reason == face.tool_reason()
    second = post(face.path, face.follow_up(first, (call_id, name, arguments)))
    text, calls, _ = face.streamed(second) if stream else face.whole(second)
    assert text and calls == []
    sent = fake_upstream.requests_for(VENDOR[kind])[-1].body.decode()
    assert ("21 C" in sent and call_id in sent) or kind == "gemini"  # gemini: by name


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", KINDS)
def test_failover_before_the_first_token(face, kind, stream, fake_upstream, post):
    """The first candidate (another vendor) fails before any token; ``kind`` serves."""
    first_kind = "anthropic" if VENDOR.get(kind) != "anthropic" else "openai_compatible"
    make_chain(
        "main",
        [row("first", first_kind, fake_upstream, max_retries=0), row("p", kind, fake_upstream)],
    )
    fake_upstream.script(VENDOR[first_kind], Faults.unavailable(VENDOR[first_kind]))
    answer = post(face.path, face.body("Say hello.", stream=stream))
    text, _, _ = face.streamed(answer) if stream else face.whole(answer)
    assert text
    decision = RoutingDecision.objects.get()
    assert [a.outcome for a in decision.attempts.order_by("index")] == ["error", "ok"]
    assert decision.selected_provider == "p"


@pytest.mark.parametrize("kind", LIVE_KINDS)
def test_a_cut_after_the_commit_point_ends_with_the_faces_error_event(
    face, kind, fake_upstream, post
):
    make_chain("main", [row("p", kind, fake_upstream), row("next", "mock", fake_upstream)])
    fake_upstream.script(VENDOR[kind], Faults.stream(text=TEXT, error_after=2, echo_key=True))
    with override_settings(LLM_ROUTING={"STREAM_IDLE_TIMEOUT_S": 2.0}):
        events = post(face.path, face.body("Tell me.", stream=True))
    assert events[-1][0] == face.error_end
    assert not any(name == face.ok_end for name, _ in events)
    deltas = [
        d["delta"].get("text") if name == "content_block_delta" else d.get("delta")
        for name, d in events
        if name in ("content_block_delta", "response.output_text.delta")
    ]
    assert "".join(deltas) in ("The quick", "The quick ")  # gemini: its own word split
    assert len(fake_upstream.requests_for(VENDOR[kind])) == 1  # no replay after the commit


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", KINDS)
def test_all_candidates_skipped_is_a_503_in_the_faces_envelope(
    face, kind, stream, fake_upstream, post
):
    make_chain("main", [row("p", kind, fake_upstream, enabled=False)])
    body = post(face.path, face.body("Say hello.", stream=stream), status=503)
    assert face.error_type(body) == face.error_types[503]
    error = body["error"]
    assert error["candidates"][0]["provider"] == "p" and "No provider" in error["message"]
    assert fake_upstream.requests == [] if hasattr(fake_upstream, "requests") else True


def test_a_budget_refuses_in_the_faces_envelope(face, fake_upstream, post):
    make_chain("main", [row("p", "mock", fake_upstream)])
    Budget.objects.create(name="alice-1", scope="user", subject="alice", max_requests=1)
    post(face.path, face.body("Say hello."))
    body = post(face.path, face.body("Say hello."), status=429)
    assert face.error_type(body) == "rate_limit_error"
    assert body["error"]["budget"] == "alice-1"


def test_a_permission_refuses_in_the_faces_envelope(face, fake_upstream, post):
    """A provider in no chain the caller may use is answered as one that does not exist
    (access.may_see: the same 404 and words as ``/v1/chat/completions``), in the face's
    envelope, and nothing is routed."""
    make_chain("main", [row("p", "mock", fake_upstream)])
    row("solo", "openai_compatible", fake_upstream)  # in no chain alice may use
    hidden = post(face.path, {**face.body("Say hello."), "model": "solo"}, status=404)
    absent = post(face.path, {**face.body("Say hello."), "model": "nowhere"}, status=404)
    assert face.error_type(hidden) == face.error_type(absent)
    assert face.error_type(hidden) in ("not_found_error", "invalid_request_error")
    words = hidden["error"]["message"].replace("solo", "X")
    assert words == absent["error"]["message"].replace("nowhere", "X")
    assert fake_upstream.requests_for("openai") == []
    assert not RoutingDecision.objects.exists()


# --- the same faces served by the ASGI application (the async view) ----------------------


def asgi_post(headers: dict[str, str], *calls: tuple[str, dict[str, Any]]) -> list[Any]:
    """POST each (path, body) to the project's ASGI application on one event loop."""
    import asyncio

    import httpx

    from llm_routing.asgi import get_asgi_application

    async def send_all() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=get_asgi_application())  # type: ignore[arg-type]
        async with httpx.AsyncClient(
            transport=transport, base_url="http://testserver", headers=headers, timeout=30
        ) as client:
            return [await client.post(path, json=body) for path, body in calls]

    return asyncio.run(send_all())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", LIVE_KINDS)
def test_under_asgi_whole_stream_and_a_cut(face, kind, fake_upstream, user, key_env, monkeypatch):
    from rest_framework.authtoken.models import Token

    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)
    make_chain("main", [row("p", kind, fake_upstream)])
    fake_upstream.script(
        VENDOR[kind],
        Faults.ok(),
        Faults.stream(text=TEXT),
        Faults.stream(text=TEXT, error_after=2),
    )
    token = Token.objects.create(user=user).key
    # The Anthropic SDK's header on /v1/messages; Bearer on /v1/responses.
    header = (
        {"x-api-key": token} if face is FACES["messages"] else {"Authorization": f"Bearer {token}"}
    )
    whole, stream, cut = asgi_post(
        header,
        (face.path, face.body("Say hello.")),
        (face.path, face.body("Tell me.", stream=True)),
        (face.path, face.body("Tell me.", stream=True)),
    )
    assert whole.status_code == 200 and face.whole(whole.json())[0]
    events = sse_events(stream.content)
    assert face.streamed(events)[0] == TEXT and events[-1][0] == face.ok_end
    assert sse_events(cut.content)[-1][0] == face.error_end
    assert key_env not in whole.text + stream.text + cut.text


def test_x_api_key_authenticates_messages_only_with_a_valid_token(fake_upstream, user, key_env):
    from rest_framework.authtoken.models import Token

    make_chain("main", [row("p", "mock", fake_upstream)])
    token = Token.objects.create(user=user).key
    client = APIClient()
    body = FACES["messages"].body("Say hello.")
    ok = client.post(
        "/v1/messages",
        body,
        format="json",
        HTTP_X_API_KEY=token,
        HTTP_ANTHROPIC_VERSION="2023-06-01",
    )
    assert ok.status_code == 200
    wrong = client.post("/v1/messages", body, format="json", HTTP_X_API_KEY="nope")
    assert wrong.status_code == 401
    assert wrong.json()["error"]["type"] == "authentication_error"
    # x-api-key is the Messages face's header only
    other = client.post(
        "/v1/responses", FACES["responses"].body("Hi"), format="json", HTTP_X_API_KEY=token
    )
    assert other.status_code in (401, 403)


# --- strict parsing, in each face's envelope -------------------------------------------

PNG = "iVBORw0KGgoAAAANSUhEUg=="
REFUSED_MESSAGES = [
    ({"temperatur": 0.5}, "temperatur: Extra inputs are not permitted."),
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": "100"}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": 5}, "top_k: top_k is not supported by this router"),
    ({"stream": "yes"}, "stream"),
    ({"metadata": {"user_id": "u", "x": 1}}, "metadata.x: Extra inputs are not permitted."),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool"),
    ({"tools": [{"name": "f"}]}, "tools.0.input_schema: Field required."),
    ({"tools": [{"name": "f", "input_schema": {"type": "nope"}}]}, "tools.0.input_schema"),
    ({"tool_choice": {"type": "any"}}, "tool_choice: tool_choice needs tools."),
    ({"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}, "disable_parallel"),
    ({"messages": []}, "messages: Expected a non-empty list of messages."),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "y": 1}]}]},
        "messages.0.content.0.y: Extra inputs are not permitted.",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
        "messages.0.content.0.type",
    ),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/bmp", "data": PNG},
                        }
                    ],
                }
            ]
        },
        "messages.0.content.0.source.media_type",
    ),
    ({"messages": [{"role": "user", "content": "a\x00b"}]}, "messages.0.content"),
    (
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}],
                },
            ]
        },
        "messages.1.content.0.tool_use_id",
    ),
    ({"system": [{"type": "image"}]}, "system.0"),
]
REFUSED_RESPONSES = [
    ({"temperatur": 0.5}, "Unknown parameter: 'temperatur'."),
    ({"store": True}, "store: Not supported: this face is stateless"),
    (
        {"previous_response_id": "resp_1"},
        "previous_response_id: Not supported: this face is stateless",
    ),
    ({"conversation": "conv_1"}, "conversation: Not supported: this face is stateless"),
    ({"background": True}, "background: Not supported: this face is stateless"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls: Not supported by this router"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type: The built-in tool 'web_search'"),
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "'file_search'"),
    ({"tools": [{"type": "computer_use_preview"}]}, "'computer_use_preview'"),
    ({"tools": [{"type": "function", "name": "f", "x": 1}]}, "Unknown parameter: 'tools[0].x'."),
    ({"tool_choice": "required"}, "tool_choice: tool_choice needs tools."),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    (
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
        "text.format.schema",
    ),
    ({"input": []}, "input: Expected a string or a non-empty list of input items."),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "stateless"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        "input.0.content.0.type",
    ),
    (
        {"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]},
        "input.0.call_id",
    ),
    ({"input": [{"role": "user", "content": "Hi", "extra": 1}]}, "input.0.extra"),
]


@pytest.mark.parametrize(("change", "expected"), REFUSED_MESSAGES)
def test_messages_refuses_in_anthropics_envelope_naming_the_field(change, expected, post):
    make_chain("main", [Provider.objects.create(name="m", kind="mock", model="mock-1")])
    body = {k: v for k, v in {**FACES["messages"].body("Hi"), **change}.items() if v is not None}
    error = post("/v1/messages", body, status=400)
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert expected in error["error"]["message"]
    assert not RoutingDecision.objects.exists()


@pytest.mark.parametrize(("change", "expected"), REFUSED_RESPONSES)
def test_responses_refuses_in_openais_envelope_naming_the_field(change, expected, post):
    make_chain("main", [Provider.objects.create(name="m", kind="mock", model="mock-1")])
    error = post("/v1/responses", {**FACES["responses"].body("Hi"), **change}, status=400)["error"]
    assert error["type"] == "invalid_request_error" and expected in error["message"]
    assert error["param"] and error["message"].replace(f"{error['param']}: ", "")
    if expected.startswith("Unknown parameter"):
        assert error["code"] == "unknown_parameter"
    assert not RoutingDecision.objects.exists()


def test_an_unknown_model_is_a_404_in_each_envelope(face, post):
    body = post(face.path, {**face.body("Hi"), "model": "nope"}, status=404)
    assert face.error_type(body) in ("not_found_error", "invalid_request_error")
    assert "nope" in body["error"]["message"]


def test_a_rich_messages_request_reaches_an_openai_upstream_translated(fake_upstream, post):
    """system blocks, an image (base64 and URL), a tool round trip, stop sequences,
    sampling, metadata.user_id, tool_choice: what an OpenAI-compatible upstream sees."""
    make_chain("main", [row("p", "openai_compatible", fake_upstream, supports_images=True)])
    body = {
        "model": "main",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this, and the weather?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                    },
                    {
                        "type": "image",
                        "source": {"type": "url", "url": "https://img.example/a.jpg"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "21 C"}],
                    },
                    {"type": "text", "text": "Thanks."},
                ],
            },
        ],
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "stop_sequences": ["END"],
        "temperature": 0.2,
        "top_p": 0.9,
        "metadata": {"user_id": "user-42"},
    }
    answer = post("/v1/messages", body)
    assert answer["stop_reason"] == "tool_use"
    sent = fake_upstream.requests_for("openai")[0].json
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool", "user"]
    assert sent["messages"][0]["content"] == "Be brief."
    images = [
        p["image_url"]["url"] for p in sent["messages"][1]["content"] if p["type"] == "image_url"
    ]
    assert images == [f"data:image/png;base64,{PNG}", "https://img.example/a.jpg"]
    call = sent["messages"][2]["tool_calls"][0]
    assert call["id"] == "toolu_1" and json.loads(call["function"]["arguments"]) == {
        "city": "Paris"
    }
    assert sent["messages"][3] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": "21 C",
    } or (
        sent["messages"][3]["tool_call_id"] == "toolu_1"
        and sent["messages"][3]["content"] == "21 C"
    )
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["stop"] == ["END"] and sent["temperature"] == 0.2 and sent["user"] == "user-42"


def test_a_responses_request_with_instructions_and_a_schema_reaches_anthropic(fake_upstream, post):
    make_chain("main", [row("p", "anthropic", fake_upstream, supports_structured_output=True)])
    body = {
        "model": "main",
        "instructions": "Answer as JSON.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}],
        "text": {"format": {"type": "json_schema", "name": "w", "schema": SCHEMA, "strict": True}},
        "max_output_tokens": 50,
        "metadata": {"trace": "t1"},
    }
    answer = post("/v1/responses", body)
    assert answer["status"] == "completed" and answer["text"]["format"]["name"] == "w"
    (text,) = [p["text"] for i in answer["output"] for p in i["content"]]
    assert set(json.loads(text)) == {"city"}
    sent = fake_upstream.requests_for("anthropic")[0].json
    assert "Answer as JSON." in json.dumps(sent["system"]) and sent["max_tokens"] == 50


def test_count_tokens_answers_an_estimate(post):
    make_chain("main", [Provider.objects.create(name="m", kind="mock", model="mock-1")])
    body = {"model": "main", "messages": [{"role": "user", "content": "x" * 400}]}
    small = post("/v1/messages/count_tokens", body)["input_tokens"]
    assert 100 <= small <= 130  # four characters a token, plus the JSON around them
    refused = post("/v1/messages/count_tokens", {**body, "max_tokens": 5}, status=400)
    assert refused["error"]["type"] == "invalid_request_error"
    assert not RoutingDecision.objects.exists()


def test_models_lists_the_faces_each_name_serves(api, fake_upstream):
    make_chain("main", [row("p", "anthropic", fake_upstream)])
    listed = {m["id"]: m for m in api.get("/v1/models").json()["data"]}
    for name in ("main", "p"):  # an anthropic provider serves no embeddings
        assert listed[name]["faces"] == ["/v1/chat/completions", "/v1/responses", "/v1/messages"]
    assert listed["mock"]["faces"][-1] == "/v1/embeddings"


@pytest.mark.django_db(transaction=True)  # the decision is committed, as on a server
def test_a_stream_the_client_leaves_is_recorded_when_the_response_closes(
    face, fake_upstream, api, key_env
):
    """WSGI: the server closes the response when the client goes away; the router's
    stream is closed then (``sse.EventFrames``), so the decision is written at that
    moment — not left to the router stream's finalizer, which only hands it to the
    write-behind queue."""
    make_chain("main", [row("p", "openai", fake_upstream)])
    fake_upstream.script("openai", Faults.stream(text=TEXT))
    response = api.post(face.path, face.body("Tell me.", stream=True), format="json")
    assert response.status_code == 200
    kept = response.streaming_content  # the server holds the body while it sends
    next(iter(kept))  # the first frame went out; then the client leaves
    response.close()  # as the server does when the client has gone
    request_id = response.headers["X-Request-ID"]
    assert RoutingDecision.objects.filter(request_id=request_id).count() == 1
    del kept


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"input": "hi"}),
    ],
)
@pytest.mark.parametrize("model", [5, 1.5, True])
def test_a_model_that_is_not_a_string_is_a_400_naming_it(path, body, model, post):
    """Strict types on every face, as on chat: a number is not coerced to a name."""
    answer = post(path, {**body, "model": model}, status=400)
    assert "model" in json.dumps(answer)
