"""The Python API (llm_routing.audit) and its sharing with the HTTP view."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

import llm_routing
from llm_routing import service
from llm_routing.types import AuditRequest, RoutingResult

pytestmark = pytest.mark.django_db


def test_audit_returns_a_typed_result() -> None:
    routed = llm_routing.audit(task="summarize", input_text="Django is a web framework.")
    assert isinstance(routed, RoutingResult)
    assert routed.result.provider == "mock" and routed.result.status == "ok"
    envelope = routed.to_dict()
    assert envelope["request_id"] == routed.request_id
    assert envelope["routing_metadata"]["router_mode"] == "default"
    assert envelope["diagnostics"] == envelope["routing_metadata"]


def test_audit_validates_like_the_http_api() -> None:
    with pytest.raises(ValidationError) as excinfo:
        llm_routing.audit(task="t", input_text="x", colour="red")
    assert excinfo.value.message_dict == {"colour": ["Unknown field."]}
    with pytest.raises(ValidationError) as excinfo:
        llm_routing.audit(task="bad task", input_text="  ")
    assert set(excinfo.value.message_dict) == {"task", "input_text"}


def test_view_and_python_api_call_the_same_function(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[AuditRequest] = []
    real_route = service.route

    def spy(request: AuditRequest, **kwargs: Any) -> RoutingResult:
        seen.append(request)
        return real_route(request, **kwargs)

    monkeypatch.setattr(service, "route", spy)
    api_result = llm_routing.audit(task="t", input_text="same", metadata={"k": "v"})
    client = APIClient()
    client.force_authenticate(get_user_model().objects.create(username="u"))
    response = client.post(
        "/audit/", {"task": "t", "input_text": "same", "metadata": {"k": "v"}}, format="json"
    )
    assert response.status_code == 200
    # The same request, except that the HTTP one carries its caller (issue 11).
    assert len(seen) == 2 and seen[0] == replace(seen[1], principal=None)
    assert seen[0].principal is None and seen[1].principal is not None
    http = response.json()
    assert set(http) == set(api_result.to_dict())
    assert http["result"]["output"] == api_result.result.output
    assert response["X-Request-ID"] == http["request_id"]
