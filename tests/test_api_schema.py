"""The OpenAPI reference is written for users: every operation has a summary, a
description, examples for each answer it documents, no internal notes, and the
examples have the shape the code really answers."""

from __future__ import annotations

from typing import Any

import pytest
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from llm_routing.api import schema_docs

pytestmark = pytest.mark.django_db

ENDPOINTS = {
    ("post", "/audit/"),
    ("get", "/audit/jobs/{job_id}/"),
    ("get", "/audit/explain/"),
    ("get", "/health/"),
    ("post", "/v1/chat/completions"),
    ("get", "/v1/models"),
    ("post", "/v1/responses"),
    ("post", "/v1/messages"),
    ("post", "/v1/messages/count_tokens"),
    ("post", "/v1/embeddings"),
}


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    generated = SchemaGenerator().get_schema(request=None, public=True)
    validate_schema(generated)
    return generated


def operations(schema: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): op
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
        if method in {"get", "post", "put", "patch", "delete"}
    }


def examples(media: dict[str, Any]) -> dict[str, Any]:
    return {
        name: ex for content in media.values() for name, ex in content.get("examples", {}).items()
    }


def test_every_endpoint_is_in_the_schema(schema) -> None:
    assert set(operations(schema)) == ENDPOINTS


def test_every_operation_has_summary_description_and_no_internal_note(schema) -> None:
    for key, op in operations(schema).items():
        assert op.get("summary"), key
        description = op.get("description", "")
        assert len(description) > 200, key
        assert "override_settings" not in description, key
        assert "DESIGN" not in description, key


def test_every_documented_answer_has_an_example(schema) -> None:
    for key, op in operations(schema).items():
        for code, response in op["responses"].items():
            assert examples(response.get("content", {})), (key, code)
        if "requestBody" in op:
            assert examples(op["requestBody"]["content"]), key


def test_audit_documents_success_fallback_and_every_error(schema) -> None:
    op = operations(schema)[("post", "/audit/")]
    assert set(op["responses"]) >= {"200", "202", "400", "401", "413", "429"}
    ok = op["responses"]["200"]["content"]["application/json"]["examples"]
    assert op["responses"]["200"]["content"]["text/event-stream"]["examples"]
    reasons = {ex["value"]["routing_metadata"]["fallback_reason"] for ex in ok.values()}
    assert {None, "unavailable", "missing_key"} <= reasons
    assert {"ok", "error"} <= {ex["value"]["result"]["status"] for ex in ok.values()}


def keys(value: Any) -> Any:
    """The shape of a JSON value: dict keys, recursively (first item of lists)."""
    if isinstance(value, dict):
        return {k: keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [keys(value[0])] if value and isinstance(value[0], dict) else []
    return None


def test_audit_examples_have_the_shape_of_a_real_answer(api: APIClient) -> None:
    real = api.post("/audit/", {"task": "t", "input_text": "x"}, format="json").json()
    for name in ("AUDIT_OK", "AUDIT_FALLBACK", "AUDIT_MOCK", "AUDIT_ERROR"):
        example = getattr(schema_docs, name)
        assert set(example) == set(real), name
        assert set(example["result"]) == set(real["result"]), name
        assert set(example["routing_metadata"]) == set(real["routing_metadata"]), name
        attempt = example["routing_metadata"]["attempts"][0]
        assert set(attempt) == set(real["routing_metadata"]["attempts"][0]), name


def test_health_example_has_the_shape_of_a_real_answer(api: APIClient, admin_client: Any) -> None:
    from .conftest import make_provider

    make_provider("openai-main", kind="openai", api_key_env="OPENAI_API_KEY")
    real = admin_client.get("/health/").json()  # the operator's view
    example = schema_docs.HEALTH["examples"][0].value
    assert keys(example["providers"][0]) == keys(real["providers"][0])
    assert set(example) == set(real)
    summary = schema_docs.HEALTH["examples"][1].value  # a caller's
    assert summary == api.get("/health/").json()


def test_models_example_has_the_shape_of_a_real_answer(api: APIClient) -> None:
    real = api.get("/v1/models").json()
    example = schema_docs.MODELS["examples"][0].value
    assert set(example) == set(real)
    assert set(example["data"][0]) == set(real["data"][0])


def test_schema_and_docs_pages_are_public() -> None:
    anon = APIClient()
    assert anon.get("/api/schema/").status_code == 200
    page = anon.get("/api/docs/")
    assert page.status_code == 200
