"""Property tests of the faces' parsing: whatever JSON a client sends to
``/v1/messages``, ``/v1/messages/count_tokens`` or ``/v1/responses`` — unknown keys,
wrong types, NUL and lone surrogates (sent JSON-escaped, as real clients do), blocks and
items of the wrong kind in the wrong place — the answer is an answer or a 4xx in the
face's envelope, never a 500. Derandomized: the same cases on every run."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.django_db

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(
        [
            "text", "image", "tool_use", "tool_result", "user", "assistant", "system",
            "function_call", "function_call_output", "message", "input_text", "output_text",
            "input_image", "item_reference", "base64", "url", "image/png", "x", "", "\x00",
            "\ud800", "call_1", "get_weather", "data:image/png;base64,AAAA",
            "https://a.example/c.png", "auto", "any", "tool", "none", "json_schema",
        ]
    )
)  # fmt: skip
KEYS = st.sampled_from(
    [
        "type", "role", "content", "text", "source", "media_type", "data", "url", "id",
        "name", "input", "tool_use_id", "is_error", "call_id", "arguments", "output",
        "image_url", "detail", "status", "cache_control", "input_schema", "parameters",
        "format", "schema", "effort",
    ]
)  # fmt: skip
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=25,
)
SETTINGS = settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


def post(api: Any, path: str, body: dict[str, Any]) -> Any:
    response = api.post(path, json.dumps(body), content_type="application/json")  # escaped
    assert response.status_code < 500, (path, body, response.content)
    if response.status_code >= 400:
        error = response.json()
        assert error["type"] == "error" if path.startswith("/v1/messages") else error["error"]
    return response


@SETTINGS
@given(
    body=st.dictionaries(
        st.sampled_from(
            ["messages", "system", "tools", "tool_choice", "stop_sequences", "metadata",
             "max_tokens", "temperature", "stream", "top_k"]
        ),
        JSON,
        max_size=4,
    ),
    rbody=st.dictionaries(
        st.sampled_from(
            ["input", "instructions", "tools", "tool_choice", "text", "metadata", "reasoning",
             "include", "store", "max_output_tokens", "parallel_tool_calls"]
        ),
        JSON,
        max_size=4,
    ),
)  # fmt: skip
def test_top_level_parameters_never_500(api, body, rbody):
    post(api, "/v1/messages", {"model": "mock", "max_tokens": 10, **body})
    counted = {k: v for k, v in body.items() if k in ("messages", "system", "tools")}
    post(api, "/v1/messages/count_tokens", {"model": "mock", **counted})
    post(api, "/v1/responses", {"model": "mock", "input": "hi", **rbody})


@SETTINGS
@given(
    content=st.lists(st.dictionaries(KEYS, JSON, max_size=5), max_size=3),
    role=st.sampled_from(["user", "assistant"]),
    item=st.dictionaries(KEYS, JSON, max_size=6),
)
def test_blocks_and_items_never_500(api, content, role, item):
    call = {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [call]},
        {"role": role, "content": content},
    ]
    post(api, "/v1/messages", {"model": "mock", "max_tokens": 10, "messages": messages})
    items = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        item,
    ]
    post(api, "/v1/responses", {"model": "mock", "input": items})
