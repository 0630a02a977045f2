"""Issue 22, the input boundary: every string and JSON value of a request is checked once,
where it enters (``llm_routing/boundary.py``). Bad text — a lone surrogate, NUL, NaN /
Infinity, an integer past 64 bits, JSON nested too deeply anywhere (tool-call arguments,
explain's schema) — is a 400 naming the field, on both faces, before any upstream is called.

The requests go over the API to provider rows pointed at the fake upstream (real HTTP):
a refused request must leave the upstream untouched and record nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from llm_routing.models import RoutingDecision
from tests.fakes.upstream import FakeUpstream

pytestmark = pytest.mark.django_db

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "description": "A tool.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}


def conversation(**overrides: Any) -> list[dict[str, Any]]:
    """A user turn, an assistant tool call and its answer, then a user turn."""
    call = {**CALL, **overrides.pop("call", {})}
    call["function"] = {**CALL["function"], **overrides.pop("function", {})}
    user = {"role": "user", "content": "hi", **overrides.pop("user", {})}
    return [
        user,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "1"},
        {"role": "user", "content": "and now?"},
    ]


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> APIClient:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-api-test-123456")
    api = APIClient()
    api.force_authenticate(get_user_model().objects.create_user("alice", password="pw-12345678"))
    return api


@pytest.fixture
def upstream(fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]) -> FakeUpstream:
    upstream_chain(
        (
            "compat",
            "openai_compatible",
            {"supports_tools": True, "supports_images": True, "supports_streaming": True},
        )
    )
    return fake_upstream


def send(client: APIClient, face: str, body: dict[str, Any], raw: str | None = None) -> Any:
    """POST ``body`` (``raw``: the JSON text as is, e.g. with NaN) to one face."""
    if face == "audit":
        body = {"task": "chat", **body}
        path = "/audit/"
    else:
        body = {"model": "default", **body}
        path = "/v1/chat/completions"
    text = json.dumps(body)  # ensure_ascii: a lone surrogate goes as a "\ud800" escape
    if raw is not None:
        text = "{" + ('"task": "chat", ' if face == "audit" else '"model": "default", ') + raw
    return client.generic("POST", path, text.encode(), content_type="application/json")


def named(response: Any, face: str) -> str:
    """The field an error names: /v1's ``param``, or /audit/'s nested keys joined."""
    body = response.json()
    if face == "v1":
        return str(body["error"]["param"])
    parts: list[str] = []
    node: Any = body
    while isinstance(node, dict) and node:
        key = next(iter(node))
        if key != "non_field_errors":
            parts.append(str(key))
        node = node[key]
    return ".".join(parts)


def assert_refused(response: Any, face: str, field: str, upstream: FakeUpstream) -> None:
    assert response.status_code == 400, response.content
    assert named(response, face) == field, response.json()
    assert upstream.requests == []  # nothing was sent (or billed) upstream
    assert RoutingDecision.objects.count() == 0


FACES = ["audit", "v1"]
SURROGATE = "\ud800"

# (the body's chat fields, the field the 400 names) — finding 1 and finding 5's places.
BAD_TEXT_PLACES: list[tuple[str, dict[str, Any], str]] = [
    ("name", {"messages": conversation(user={"name": "x" + SURROGATE})}, "messages.0.name"),
    (
        "tool call id",
        {"messages": conversation(call={"id": "c" + SURROGATE})},
        "messages.1.tool_calls.0.id",
    ),
    (
        "tool call arguments (the text)",
        {"messages": conversation(function={"arguments": '{"a": "' + SURROGATE + '"}'})},
        "messages.1.tool_calls.0.function.arguments",
    ),
    (
        "tool call arguments (a JSON escape inside)",
        {"messages": conversation(function={"arguments": '{"a": "\\ud800"}'})},
        "messages.1.tool_calls.0.function.arguments",
    ),
    (
        "image url",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is it?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": "https://img.example/a" + SURROGATE + ".png"},
                        },
                    ],
                }
            ]
        },
        "messages.0.content.1.image_url.url",
    ),
    (
        "tool description",
        {
            "messages": conversation(),
            "tools": [{**TOOL, "function": {**TOOL["function"], "description": "d" + SURROGATE}}],
        },
        "tools.0.function.description",
    ),
    (
        "tool parameters",
        {
            "messages": conversation(),
            "tools": [
                {
                    **TOOL,
                    "function": {
                        **TOOL["function"],
                        "parameters": {"type": "object", "description": SURROGATE},
                    },
                }
            ],
        },
        "tools.0.function.parameters.description",
    ),
    ("stop", {"messages": conversation(), "stop": ["ok" + SURROGATE]}, "stop.0"),
]


def _with(text: str, body: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(body).replace("\\ud800", text))


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize(
    ("place", "body", "field"), BAD_TEXT_PLACES, ids=[p[0] for p in BAD_TEXT_PLACES]
)
def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field(
    client, upstream, face, place, body, field
):
    if face == "audit" and "stop" in body:
        body = {"messages": body["messages"], "metadata": {"k": body["stop"][0]}}
        field = "metadata.k"
    response = send(client, face, body)
    assert_refused(response, face, field, upstream)
    assert "surrogate" in response.content.decode().lower()


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize(
    ("place", "body", "field"),
    [p for p in BAD_TEXT_PLACES if "escape" not in p[0]],
    ids=[p[0] for p in BAD_TEXT_PLACES if "escape" not in p[0]],
)
def test_nul_anywhere_is_a_400_naming_the_field(client, upstream, face, place, body, field):
    body = _with("\\u0000", body)
    if face == "audit" and "stop" in body:
        body = {"messages": body["messages"], "metadata": {"k": body["stop"][0]}}
        field = "metadata.k"
    response = send(client, face, body)
    assert_refused(response, face, field, upstream)
    assert "null characters" in response.content.decode().lower()


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_in_tool_parameters_are_a_400_not_a_502(
    client, upstream, face, constant
):
    # Today: 502 "adapter failed unexpectedly", charged to the provider's health.
    tools = json.dumps([TOOL]).replace(
        '"type": "integer"', f'"type": "integer", "maximum": {constant}'
    )
    raw = f'"messages": {json.dumps(conversation())}, "tools": {tools}}}'
    response = send(client, face, {}, raw=raw)
    assert_refused(response, face, "tools.0.function.parameters.properties.a.maximum", upstream)


@pytest.mark.parametrize("face", FACES)
def test_nan_as_a_sampling_parameter_is_a_400(client, upstream, face):
    raw = f'"messages": {json.dumps(conversation())}, "temperature": NaN}}'
    if face == "audit":
        raw = f'"messages": {json.dumps(conversation())}, "response_schema": {{"maximum": NaN}}}}'
    response = send(client, face, {}, raw=raw)
    assert_refused(
        response, face, "temperature" if face == "v1" else "response_schema.maximum", upstream
    )


@pytest.mark.parametrize("face", FACES)
def test_an_integer_past_64_bits_is_a_400(client, upstream, face):
    body: dict[str, Any] = {"messages": conversation()}
    if face == "v1":
        body["seed"] = 2**64
        field = "seed"
    else:
        body["response_schema"] = {"type": "integer", "maximum": 10**30}
        field = "response_schema.maximum"
    assert_refused(send(client, face, body), face, field, upstream)


@pytest.mark.parametrize("face", FACES)
def test_deeply_nested_tool_call_arguments_are_a_400_not_a_500(client, upstream, face):
    # Today: json.loads raises RecursionError → 500 on both faces.
    deep = "[" * 50_000 + "]" * 50_000
    body = {"messages": conversation(function={"arguments": '{"a": ' + deep + "}"})}
    response = send(client, face, body)
    assert_refused(response, face, "messages.1.tool_calls.0.function.arguments", upstream)
    assert "nested deeper" in response.content.decode()


@pytest.mark.parametrize("face", FACES)
def test_arguments_nested_just_within_the_limit_are_accepted(client, upstream, face):
    # MAX_JSON_DEPTH (32) counts the arguments object itself as level 1.
    inner = "[" * 31 + "]" * 31
    body = {"messages": conversation(function={"arguments": '{"a": ' + inner + "}"})}
    response = send(client, face, body)
    assert response.status_code == 200, response.content


def test_model_must_be_a_string_not_coerced(client, upstream):
    # Today: "model": 5 is coerced to "5" (404 model_not_found, or served if named "5").
    response = send(client, "v1", {"model": 5, "messages": conversation()})
    assert_refused(response, "v1", "model", upstream)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (
            {"stream": True, "stream_options": {"include_usage": True, "typo": 1}},
            "stream_options.typo",
        ),
        ({"response_format": {"type": "json_object", "strict": True}}, "response_format.strict"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object"}, "schemas": {}},
                }
            },
            "response_format.json_schema.schemas",
        ),
    ],
)
def test_unknown_keys_in_closed_objects_are_refused(client, upstream, extra, field):
    # Today: silently ignored.
    response = send(client, "v1", {"messages": conversation(), **extra})
    assert_refused(response, "v1", field, upstream)


# --- explain's query ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        "[" * 1_500 + "]" * 1_500,  # today: RecursionError → 500
        json.dumps(
            json.loads(
                '{"type": "object", "properties": {"a": ' * 100 + '{"type": "string"}' + "}}" * 100
            )
        ),  # today: skips MAX_JSON_DEPTH → 500
        '{"type": "object", "description": "\\ud800"}',
        '{"type": "number", "maximum": NaN}',
    ],
    ids=["1500-brackets", "100-nested-properties", "surrogate", "nan"],
)
def test_explain_schema_goes_through_the_same_boundary(client, upstream, schema):
    response = client.get("/audit/explain/", {"task": "chat", "schema": schema})
    assert response.status_code == 400, response.content
    assert "schema" in response.json()


def test_explain_schema_is_still_accepted_when_valid(client, upstream):
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "string"}}})
    response = client.get("/audit/explain/", {"task": "chat", "schema": schema})
    assert response.status_code == 200, response.content


# --- the Python API goes through the same boundary ---------------------------------------


def test_python_api_refuses_a_lone_surrogate_naming_the_field(upstream):
    from llm_routing import chat

    with pytest.raises(ValidationError) as caught:
        chat(conversation(user={"name": SURROGATE}))
    assert "messages.0.name" in caught.value.message_dict
    assert upstream.requests == []
    assert RoutingDecision.objects.count() == 0


def test_python_api_refuses_nan(upstream):
    from llm_routing import chat

    with pytest.raises(ValidationError) as caught:
        chat(conversation(), temperature=float("nan"))
    assert "temperature" in caught.value.message_dict
    assert upstream.requests == []


# --- the configuration file: llm_routing_apply -------------------------------------------

PROVIDER_TOML = """
[providers.p]
kind = "mock"
model = "m"
timeout_s = {timeout}
"""


def _apply(tmp_path: Any, text: str, *flags: str) -> str:
    from io import StringIO

    from django.core.management import call_command

    path = tmp_path / "routing.toml"
    path.write_text(text, encoding="utf-8")
    out = StringIO()
    call_command("llm_routing_apply", str(path), *flags, stdout=out, no_color=True)
    return out.getvalue()


@pytest.mark.parametrize("flags", [(), ("--dry-run",)], ids=["apply", "dry-run"])
def test_apply_of_a_5000_deep_toml_is_a_command_error_not_a_traceback(tmp_path, flags):
    from django.core.management import CommandError

    from llm_routing.models import Provider

    deep = '[providers.p]\nkind = "mock"\nparams = { a = ' + "[" * 5_000 + "]" * 5_000 + " }\n"
    with pytest.raises(CommandError, match="nested deeper than"):
        _apply(tmp_path, deep, *flags)
    deep_tables = "[providers.p.params." + ".".join(["a"] * 5_000) + "]\n"
    with pytest.raises(CommandError, match="nested deeper than"):
        _apply(tmp_path, deep_tables, *flags)
    assert not Provider.objects.exists()


@pytest.mark.parametrize("flags", [(), ("--dry-run",)], ids=["apply", "dry-run"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_apply_and_dry_run_refuse_non_finite_numbers_naming_the_field(tmp_path, flags, value):
    # Today: --dry-run accepts timeout_s = nan; the real apply then fails on NOT NULL.
    from django.core.management import CommandError

    from llm_routing.models import Provider

    with pytest.raises(CommandError, match=r"providers\.p\.timeout_s: NaN and Infinity"):
        _apply(tmp_path, PROVIDER_TOML.format(timeout=value), *flags)
    assert not Provider.objects.exists()  # nothing half-written


def test_apply_refuses_nul_in_a_string_naming_the_field(tmp_path):
    from django.core.management import CommandError

    from llm_routing.models import Provider

    text = '[providers.p]\nkind = "mock"\nmodel = "m\\u0000"\n'
    with pytest.raises(CommandError, match=r"providers\.p\.model: Null characters"):
        _apply(tmp_path, text)
    assert not Provider.objects.exists()


def test_apply_still_takes_a_finite_timeout(tmp_path):
    from llm_routing.models import Provider

    _apply(tmp_path, PROVIDER_TOML.format(timeout="12.5"))
    assert Provider.objects.get(name="p").timeout_s == 12.5


# --- the mock honours the schema, or fails honestly --------------------------------------

MOCK_SCHEMAS = {
    "minItems": {"type": "array", "items": {"type": "string"}, "minItems": 12},
    "minProperties": {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "required": ["a"],
        "minProperties": 2,
    },
    "minProperties-extra": {"type": "object", "minProperties": 3},
    "uniqueItems": {
        "type": "array",
        "items": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "minItems": 3,
        "uniqueItems": True,
    },
    "uniqueItems-strings": {
        "type": "array",
        "items": {"type": "string"},
        "minItems": 3,
        "uniqueItems": True,
    },
    "minContains": {
        "type": "array",
        "items": {"type": "integer"},
        "contains": {"const": 7},
        "minContains": 2,
    },
    "contains": {"type": "array", "contains": {"type": "string", "enum": ["x"]}},
}


@pytest.mark.parametrize("name", list(MOCK_SCHEMAS))
def test_the_mock_answer_satisfies_min_items_properties_unique_and_contains(client, name):
    # Today: minItems capped at 8, minProperties / uniqueItems / minContains ignored, and the
    # mock still says "ok".
    import jsonschema

    schema = MOCK_SCHEMAS[name]
    body = {"task": "t", "input_text": "hi", "provider": "mock", "response_schema": schema}
    response = client.post("/audit/", body, format="json")
    assert response.status_code == 200, response.content
    result = response.json()["result"]
    assert result["status"] == "ok"
    jsonschema.validate(result["data"], schema)


def test_a_schema_the_mock_cannot_satisfy_is_an_honest_error(client):
    # Three distinct booleans cannot exist: no "ok" answer breaking the schema.
    schema = {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "uniqueItems": True}
    body = {"task": "t", "input_text": "hi", "provider": "mock", "response_schema": schema}
    response = client.post("/audit/", body, format="json")
    result = response.json()["result"]
    assert result["status"] == "error", result
    assert "mock cannot produce an answer" in result["error"]["message"]


# --- the walk itself ---------------------------------------------------------------------


def test_the_walk_names_the_first_problem_in_document_order_without_recursion():
    from llm_routing.boundary import InputRefused, check, problems

    deep: Any = "leaf"
    for _ in range(100_000):  # built without recursion, walked without recursion
        deep = [deep]
    with pytest.raises(InputRefused) as caught:
        check({"a": "ok", "b": [1, deep], "c": "\x00"})
    # The first container past the limit (level 33), not the NUL in "c" after it.
    assert caught.value.place.startswith("b.1.0.") and len(caught.value.path) == 32
    assert "nested deeper than 32" in caught.value.reason
    found = list(problems({"x": [0.5, float("nan")], "y": {"k\ud800": 1}, 3: 2**63}))
    # A key's problem is found when its object is entered, before the values inside.
    assert [(p.place, p.reason.split(" ")[0]) for p in found] == [
        ("", "Object"),
        ("x.1", "NaN"),
        ("y", "In"),
    ]
    assert list(problems((1, -(2**63), 2**63 - 1, "é\U0001f600"))) == []
    assert [p.place for p in problems({"t": ("ok", 2**64)}, path=("body",))] == ["body.t.1"]
    assert InputRefused(("messages", 0, "content", 1, "text"), "r").as_detail() == {
        "messages": {"0": {"content.1.text": ["r"]}}
    }


@pytest.mark.parametrize(
    "path",
    ["/audit/", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"],
)
@pytest.mark.parametrize("key", ["k\\u0000", "k\\ud800"])
def test_a_bad_key_at_the_top_of_the_body_is_an_object_400(client, upstream, path, key):
    # The fuzzer's find: a NUL in a key of the body itself had no field to name, and
    # /audit/ answered a bare list (["In a key: …"]), not the object its schema documents.
    text = '{"' + key + '": 1, "model": "default", "task": "chat", "input": "x"}'
    response = client.generic("POST", path, text.encode(), content_type="application/json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert isinstance(body, dict), body
    assert "in a key" in response.content.decode().lower()
    if path == "/audit/":
        assert list(body) == ["non_field_errors"]
    elif path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["param"] is None
    assert upstream.requests == []
    assert RoutingDecision.objects.count() == 0
