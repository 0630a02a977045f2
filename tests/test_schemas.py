"""Issue 11 (part A, items 1, 2 and 6): no schema causes I/O, the mock's answer is bounded,
patterns run on RE2. Each request goes through the real API views."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.test import override_settings

from llm_routing.errors import ResponseError
from llm_routing.providers.base import validate_structured
from llm_routing.providers.mock import instance_from_schema
from llm_routing.schemas import (
    AnswerValidator,
    SchemaRefused,
    SchemaTooLarge,
    answer_validator,
    check_schema,
    example_instance,
)

pytestmark = pytest.mark.django_db


class CountingServer:
    """A real local HTTP server that counts every request and serves a schema."""

    def __init__(self) -> None:
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                body = json.dumps({"type": "string", "maxLength": 1}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/schema+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/schema.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def counting() -> Iterator[CountingServer]:
    server = CountingServer()
    yield server
    server.close()


def audit(api, schema: object):
    body = {"task": "t", "input_text": "hi", "response_schema": schema}
    return api.post("/audit/", data=json.dumps(body), content_type="application/json")


def chat(api, schema: object):
    body = {
        "model": "mock",
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }
    return api.post("/v1/chat/completions", data=json.dumps(body), content_type="application/json")


# --- item 1: no schema causes I/O ----------------------------------------------------


def test_remote_ref_in_audit_schema_is_a_400_and_fetches_nothing(api, counting):
    response = audit(api, {"$ref": counting.url})
    assert response.status_code == 400
    assert "response_schema" in response.json()
    assert "only local references" in response.json()["response_schema"][0]
    assert counting.hits == 0


def test_remote_ref_nested_under_properties_is_refused(api, counting):
    schema = {"type": "object", "properties": {"a": {"items": {"$ref": counting.url}}}}
    response = audit(api, schema)
    assert response.status_code == 400
    assert "response_schema" in response.json()
    assert counting.hits == 0


def test_file_ref_is_refused_and_never_read(api, tmp_path: Path):
    secret = tmp_path / "s.json"
    secret.write_text('{"type": "string", "title": "local file"}')
    response = audit(api, {"$ref": secret.as_uri()})
    assert response.status_code == 400
    assert "response_schema" in response.json()


def test_remote_ref_in_v1_json_schema_is_a_400_naming_the_field(api, counting):
    response = chat(api, {"$ref": counting.url})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "response_format.json_schema.schema"  # the exact place
    assert error["message"].startswith("response_format.json_schema.schema: ")
    assert "only local references" in error["message"]
    assert counting.hits == 0


def test_unresolvable_local_ref_is_a_400(api):
    response = audit(api, {"$ref": "#/$defs/missing"})
    assert response.status_code == 400
    assert "does not resolve" in response.json()["response_schema"][0]


def test_local_refs_are_accepted(api):
    schema = {
        "$defs": {"name": {"type": "string"}},
        "type": "object",
        "properties": {"n": {"$ref": "#/$defs/name"}},
        "required": ["n"],
    }
    response = audit(api, schema)
    assert response.status_code == 200, response.content
    assert response.json()["result"]["data"] == {"n": "mock"}


def test_validating_an_answer_never_fetches_a_remote_ref(counting):
    # The Python API skips the serializer: the answer validator itself must not fetch.
    with pytest.raises(ResponseError):
        validate_structured('"a long answer"', {"$ref": counting.url})
    assert counting.hits == 0


def test_validating_an_answer_never_reads_a_file_ref(tmp_path: Path):
    schema_file = tmp_path / "s.json"
    schema_file.write_text('{"type": "string", "maxLength": 1}')
    # On a retrieving registry this would load the file and fail on maxLength with a
    # "does not match" message; without retrieval the reference is unresolvable.
    with pytest.raises(ResponseError, match="could not be validated"):
        validate_structured('"a long answer"', {"$ref": schema_file.as_uri()})


# --- item 2: the mock's answer is bounded ----------------------------------------------


def amplifier(levels: int = 9, min_length: int = 10**7) -> dict:
    """The attack's shape: nested minItems over a huge minLength, a few hundred bytes."""
    schema: dict = {"type": "string", "minLength": min_length}
    for _ in range(levels):
        schema = {"type": "array", "minItems": 8, "items": schema}
    return schema


def test_amplifying_schema_is_a_400_at_validation(api):
    schema = amplifier()
    assert len(json.dumps(schema)) < 600
    response = audit(api, schema)
    assert response.status_code == 400
    assert "MOCK_MAX_OUTPUT_BYTES" in response.json()["response_schema"][0]


def test_amplifying_schema_is_a_400_on_v1(api):
    response = chat(api, amplifier())
    assert response.status_code == 400
    assert "MOCK_MAX_OUTPUT_BYTES" in response.json()["error"]["message"]


def test_nested_min_items_alone_is_bounded_without_building_it():
    # 8 ** 9 strings of 4 characters: about 1 GB of JSON if it were built.
    with pytest.raises(SchemaTooLarge):
        example_instance(amplifier(levels=9, min_length=0))


def test_mock_answer_within_the_bound_is_generated_and_fits():
    schema = amplifier(levels=3, min_length=100)
    value = example_instance(schema, max_bytes=70_000)
    encoded = json.dumps(value)
    assert len(encoded) <= 70_000
    assert len(value) == 8 and len(value[0][0][0]) == 100
    with pytest.raises(SchemaTooLarge):
        example_instance(schema, max_bytes=len(encoded) - 1)
    assert example_instance(schema, max_bytes=len(encoded)) == value


def test_depth_past_the_bound_is_refused(api):
    schema: dict = {"type": "string"}
    for _ in range(6):
        schema = {"type": "object", "properties": {"a": schema}}
    with override_settings(LLM_ROUTING={"MOCK_MAX_DEPTH": 4}):
        response = audit(api, schema)
        assert response.status_code == 400
        assert "MOCK_MAX_DEPTH" in response.json()["response_schema"][0]
    with override_settings(LLM_ROUTING={"MOCK_MAX_DEPTH": 6}):
        assert audit(api, schema).status_code == 200


def test_python_api_with_an_oversized_schema_gets_an_error_result_not_a_crash():
    from llm_routing.router import route
    from llm_routing.types import AuditRequest

    # router.route takes an already-built request (no serializer in front of it).
    routed = route(AuditRequest(task="t", input_text="hi", response_schema=amplifier()))
    assert routed.result.status == "error"
    assert routed.result.error is not None
    assert "MOCK_MAX_OUTPUT_BYTES" in routed.result.error.message


def test_mock_alias_uses_the_bounded_generator():
    with pytest.raises(SchemaTooLarge):
        instance_from_schema(amplifier())


# --- item 6 (issue's Medium 6): patterns run on RE2 ----------------------------------------


def test_catastrophic_pattern_is_matched_by_re2():
    schema = {"type": "string", "pattern": "^(a|a)*$"}
    validator = answer_validator(schema)
    assert isinstance(validator, AnswerValidator)
    # Python's re needs about 2 ** 40 steps for this; RE2 answers in linear time.
    assert not validator.is_valid("a" * 40 + "b")
    assert validator.is_valid("a" * 40)
    with pytest.raises(ResponseError, match="pattern"):
        validate_structured(json.dumps("a" * 40 + "b"), schema)


def test_pattern_properties_and_additional_properties_use_re2():
    schema = {
        "type": "object",
        "patternProperties": {"^(a|a)*$": {"type": "integer"}},
        "additionalProperties": False,
    }
    validator = answer_validator(schema)
    assert validator.is_valid({"a" * 40: 1})
    assert not validator.is_valid({"a" * 40: "x"})
    assert not validator.is_valid({"a" * 40 + "b": 1})


@pytest.mark.parametrize("pattern", ["(a)\\1", "^(?=a)a$", "(?<!x)y", "((a{100}){100}){100}"])
def test_pattern_re2_cannot_compile_is_a_400(api, pattern):
    response = audit(api, {"type": "string", "pattern": pattern})
    assert response.status_code == 400
    assert "RE2" in response.json()["response_schema"][0]


def test_unevaluated_properties_with_pattern_properties_is_refused():
    with pytest.raises(SchemaRefused, match="unevaluatedProperties"):
        check_schema(
            {"patternProperties": {"^a": {}}, "unevaluatedProperties": False, "type": "object"}
        )


def test_live_provider_answer_with_a_remote_ref_schema_fetches_nothing(
    upstream_chain, key_env, counting
):
    # The router's own path (sync and streamed), below the HTTP API's 400: a live
    # structured provider answers, the answer is validated, and nothing is fetched.
    from llm_routing.router import route, route_stream
    from llm_routing.types import AuditRequest, StreamFailure, StreamResult

    upstream_chain(("oa", "openai", {"max_retries": 0}))
    schema = {"$ref": counting.url}
    routed = route(AuditRequest(task="t", input_text="hi", response_schema=schema))
    attempt = routed.metadata.attempts[0]
    assert (attempt.provider, attempt.error_category) == ("oa", "response")
    events = list(
        route_stream(AuditRequest(task="t", input_text="hi", response_schema=schema, stream=True))
    )
    assert isinstance(events[-1], StreamResult | StreamFailure)
    assert counting.hits == 0
