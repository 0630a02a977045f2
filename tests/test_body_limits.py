"""Issue 11 (part A, item 12): every oversized body gets the documented 413 — JSON on
/audit/, OpenAI's error envelope on /v1 — never Django's HTML 400 or a dropped
connection, whatever DATA_UPLOAD_MAX_MEMORY_SIZE says."""

from __future__ import annotations

import json

import httpx
import pytest
from django.conf import settings
from rest_framework.authtoken.models import Token

THREE_MB = 3 * 1000 * 1000


def _big_body(size: int) -> str:
    return json.dumps({"task": "t", "input_text": "x" * size})


@pytest.mark.django_db
@pytest.mark.parametrize("size", [1_500_000, THREE_MB])
def test_audit_body_over_the_cap_is_a_json_413(api, size):
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE < THREE_MB  # the case Django refuses itself
    response = api.post("/audit/", data=_big_body(size), content_type="application/json")
    assert response.status_code == 413
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Request body exceeds 1048576 bytes."}


@pytest.mark.django_db
def test_v1_body_over_the_cap_is_a_413_in_the_openai_envelope(api):
    body = json.dumps({"model": "mock", "messages": [{"role": "user", "content": "x" * THREE_MB}]})
    response = api.post("/v1/chat/completions", data=body, content_type="application/json")
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "payload_too_large" and error["type"] == "invalid_request_error"


@pytest.mark.django_db(transaction=True)
def test_three_megabyte_post_over_real_http_gets_an_answer(live_server, django_user_model):
    user = django_user_model.objects.create_user(username="big", password="pw-big-12345")
    token = Token.objects.create(user=user)
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        response = client.post(
            "/audit/",
            content=_big_body(THREE_MB).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Token {token.key}"},
        )
        assert response.status_code == 413
        assert response.json()["detail"].startswith("Request body exceeds")
        # The connection is still usable: the server read the body it refused.
        ok = client.post(
            "/audit/",
            json={"task": "t", "input_text": "hi"},
            headers={"Authorization": f"Token {token.key}"},
        )
        assert ok.status_code == 200
