"""The HTTP contract of POST /audit/ (docs/api.md): status codes, exact keys, every bad input."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from llm_routing.models import RoutingDecision

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db

URL = "/audit/"
GOOD = {"task": "summarize", "input_text": "Django is a web framework."}

RESULT_KEYS = {
    "provider", "model", "mode", "status", "output", "data", "usage", "latency_ms", "error",
    "tool_calls", "finish_reason",
}  # fmt: skip
META_KEYS = {
    "request_id", "router_mode", "route", "rule", "chain_name", "requested_provider",
    "selected_provider", "chain", "attempted_providers", "skipped_providers", "attempts",
    "fallback_used", "fallback_reason", "cost_usd", "picks", "hedge",
}  # fmt: skip
ATTEMPT_KEYS = {
    "provider", "model", "step", "outcome", "error_category", "http_status", "transient",
    "retries", "latency_ms", "cost_usd",
}  # fmt: skip


def post(client: APIClient, body: object, **extra: object):
    return client.post(URL, data=json.dumps(body), content_type="application/json", **extra)


def test_200_envelope_has_exactly_the_contract_keys(api, scripted, monkeypatch):
    monkeypatch.delenv("TEST_PROVIDER_KEY", raising=False)
    make_chain(
        "default",
        [make_provider("openai-main"), make_provider("anthropic", enabled=False)],
        is_default=True,
    )
    response = post(api, GOOD)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"request_id", "result", "routing_metadata", "diagnostics"}
    assert set(body["result"]) == RESULT_KEYS
    assert set(body["result"]["usage"]) == {"input_tokens", "output_tokens"}
    meta = body["routing_metadata"]
    assert set(meta) == META_KEYS
    assert body["diagnostics"] == meta
    assert meta["request_id"] == body["request_id"] == response["X-Request-ID"]
    assert meta["skipped_providers"] == [
        {"provider": "openai-main", "reason": "missing_key"},
        {"provider": "anthropic", "reason": "disabled"},
    ]
    assert meta["chain"] == ["openai-main", "anthropic", "mock"]
    assert meta["attempted_providers"] == ["mock"]
    assert [set(a) for a in meta["attempts"]] == [ATTEMPT_KEYS]
    assert body["result"]["provider"] == "mock" and body["result"]["model"] == "mock-1"
    assert meta["fallback_used"] is True and meta["fallback_reason"] == "missing_key"
    assert RoutingDecision.objects.filter(request_id=body["request_id"]).exists()


def test_error_result_is_still_200(api, scripted, key_env):
    from llm_routing.errors import AuthenticationError

    make_chain("default", [make_provider("a")], is_default=True)
    scripted.scripts["a"] = [AuthenticationError("bad key", http_status=401)]
    body = post(api, GOOD).json()
    assert body["result"]["status"] == "error"
    assert body["result"]["error"]["category"] == "authentication"
    assert body["result"]["error"]["http_status"] == 401


def test_all_optional_fields_accepted(api):
    body = {
        **GOOD,
        "instructions": "Be brief.",
        "provider": None,
        "route": None,
        "force_provider": None,
        "response_schema": {"type": "object", "properties": {"s": {"type": "string"}}},
        "metadata": {"tenant": "acme"},
        "stream": False,
        "async": False,
    }
    response = post(api, body)
    assert response.status_code == 200, response.content
    assert response.json()["result"]["data"] == {"s": "mock"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input_text": "x"}, "task"),
        ({**GOOD, "task": ""}, "task"),
        ({**GOOD, "task": "has space"}, "task"),
        ({**GOOD, "task": "t" * 65}, "task"),
        ({**GOOD, "task": 5}, "task"),
        ({"task": "summarize"}, "input_text"),
        ({**GOOD, "input_text": ""}, "input_text"),
        ({**GOOD, "input_text": "   \n\t "}, "input_text"),
        ({**GOOD, "input_text": None}, "input_text"),
        ({**GOOD, "input_text": "a\x00b"}, "input_text"),
        ({**GOOD, "input_text": "lone \ud800 surrogate"}, "input_text"),
        ({**GOOD, "instructions": "bad\x00"}, "instructions"),
        ({**GOOD, "metadata": {"k": 1}}, "metadata"),
        ({**GOOD, "metadata": {"k": {"nested": "x"}}}, "metadata"),
        ({**GOOD, "metadata": ["a"]}, "metadata"),
        ({**GOOD, "metadata": {f"k{i}": "v" for i in range(40)}}, "metadata"),
        ({**GOOD, "metadata": {"k": "v" * 600}}, "metadata"),
        ({**GOOD, "metadata": {"k\x00": "v"}}, "metadata"),
        ({**GOOD, "metadata": {"": "v"}}, "metadata"),
        ({**GOOD, "provider": "not a slug"}, "provider"),
        ({**GOOD, "route": "r" * 65}, "route"),
        ({**GOOD, "force_provider": "a", "provider": "b"}, "force_provider"),
        ({**GOOD, "response_schema": "nope"}, "response_schema"),
        ({**GOOD, "response_schema": {"type": "no-such-type"}}, "response_schema"),
        ({**GOOD, "stream": "maybe"}, "stream"),
        ({**GOOD, "inputtext": "typo"}, "inputtext"),
    ],
)
def test_bad_input_is_400_naming_the_field(api, body, field):
    response = post(api, body)
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert RoutingDecision.objects.count() == 0


def test_input_over_max_chars_is_400(api):
    with override_settings(LLM_ROUTING={"MAX_INPUT_CHARS": 50}):
        response = post(api, {**GOOD, "input_text": "x" * 51})
        assert response.status_code == 400
        assert "input_text" in response.json()
        assert post(api, {**GOOD, "input_text": "x" * 50}).status_code == 200


def test_instructions_over_max_is_400(api):
    with override_settings(LLM_ROUTING={"MAX_INSTRUCTIONS_CHARS": 10}):
        response = post(api, {**GOOD, "instructions": "y" * 11})
    assert response.status_code == 400 and "instructions" in response.json()


def test_body_not_an_object_is_400(api):
    for body in ([GOOD], "text", 42, None):
        response = post(api, body)
        assert response.status_code == 400, body


def test_malformed_json_is_400(api):
    response = api.post(URL, data='{"task": "x", ', content_type="application/json")
    assert response.status_code == 400
    assert "detail" in response.json()


def test_thousand_levels_of_nesting_is_400_not_500(api):
    deep = "[" * 1000 + "]" * 1000
    body = '{"task": "t", "input_text": "x", "metadata": ' + deep + "}"
    response = api.post(URL, data=body, content_type="application/json")
    assert response.status_code == 400
    deeper = "[" * 100_000 + "]" * 100_000
    response = api.post(URL, data=deeper, content_type="application/json")
    assert response.status_code == 400


def test_moderate_depth_over_limit_is_400(api):
    nested: object = "v"
    for _ in range(40):
        nested = {"k": nested}
    response = post(api, {**GOOD, "response_schema": nested})
    assert response.status_code == 400


def test_oversized_body_is_413(api):
    with override_settings(LLM_ROUTING={"MAX_REQUEST_BYTES": 1000}):
        response = post(api, {**GOOD, "input_text": "x" * 2000})
    assert response.status_code == 413
    assert RoutingDecision.objects.count() == 0


def test_non_json_content_type_is_415(api):
    response = api.post(URL, data="task=x", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415


def test_get_is_405(api):
    assert api.get(URL).status_code == 405


def test_unauthenticated_is_401(anon):
    response = post(anon, GOOD)
    assert response.status_code == 401
    assert "WWW-Authenticate" in response
    assert RoutingDecision.objects.count() == 0


def test_bad_token_is_401(anon):
    anon.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert post(anon, GOOD).status_code == 401


def test_session_auth_works_with_csrf(user):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    # Session auth enforces CSRF: without the token it is refused ...
    assert post(client, GOOD).status_code == 403
    # ... and with it, accepted.
    client.get("/admin/login/")
    csrf = client.cookies["csrftoken"].value
    assert post(client, GOOD, HTTP_X_CSRFTOKEN=csrf).status_code == 200


def test_throttled_is_429(api):
    with override_settings(LLM_ROUTING={"API_THROTTLE_RATES": {"user": "2/min", "anon": None}}):
        assert post(api, GOOD).status_code == 200
        assert post(api, GOOD).status_code == 200
        response = post(api, GOOD)
    assert response.status_code == 429
    assert "Retry-After" in response


def test_anon_throttle_applies_when_the_api_is_opened_to_anonymous_callers(anon):
    settings = {
        "API_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
        "API_THROTTLE_RATES": {"user": None, "anon": "1/min"},
    }
    with override_settings(LLM_ROUTING=settings):
        assert post(anon, GOOD).status_code == 200
        assert post(anon, GOOD).status_code == 429


def test_health_lists_providers_without_key_values(admin_client, key_env):
    make_provider("a", kind="scripted")
    make_provider("b", kind="mock", api_key_env="")
    response = admin_client.get("/health/")  # the operator's view (staff)
    assert response.status_code == 200
    providers = {p["name"]: p for p in response.json()["providers"]}
    assert providers["a"]["key_present"] is True and providers["a"]["enabled"] is True
    assert providers["b"]["key_present"] is False
    assert key_env not in response.content.decode()


def test_health_requires_auth(anon):
    assert anon.get("/health/").status_code == 401


def test_openapi_schema_and_docs_page(anon):
    schema = anon.get("/api/schema/")
    assert schema.status_code == 200
    text = schema.content.decode()
    assert "/audit/" in text and "routing_metadata" in text
    docs = anon.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger" in docs.content.lower()


def test_max_task_chars_setting_is_enforced(api):
    # issue 11: documented but ignored (the serializer hard-coded 64).
    with override_settings(LLM_ROUTING={"MAX_TASK_CHARS": 8}):
        response = post(api, {**GOOD, "task": "t" * 9})
        assert response.status_code == 400
        assert "8 characters" in response.json()["task"][0]
        assert post(api, {**GOOD, "task": "t" * 8}).status_code == 200
