"""A canary key never escapes: not in logs (DEBUG, httpx/httpcore included), not in the
database dump, not in any response body — on every error path of every vendor.

The fake upstream echoes the key it received into every error message (as vendors do
for a bad key), so scrubbing by value is exercised, not just avoided.
"""

from __future__ import annotations

import dataclasses
import io
import logging
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import override_settings
from rest_framework.test import APIClient

from llm_routing.providers.base import BaseProvider
from llm_routing.types import AuditRequest, ProviderResult
from tests.conftest import VENDOR_OF_KIND
from tests.fakes.upstream import FakeUpstream, Fault, Faults
from tests.test_providers_faults import CASES

# Real waits (the API path takes no sleeper) kept tiny: backoff ~ms, Retry-After over cap.
pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("_fast_waits"),
]


@pytest.fixture
def _fast_waits() -> Any:
    with override_settings(
        LLM_ROUTING={"BACKOFF_BASE_S": 0.001, "BACKOFF_MAX_S": 0.01, "RETRY_AFTER_CAP_S": 0.5}
    ):
        yield


CANARY = "sk-CANARY-7f3a9c1e5b2d4680"


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> APIClient:
    monkeypatch.setenv("TEST_PROVIDER_KEY", CANARY)
    api = APIClient()
    api.force_authenticate(get_user_model().objects.create_user("bob", password="pw-12345678"))
    return api


def echoing(fault: Fault) -> Fault:
    return dataclasses.replace(fault, echo_key=True) if isinstance(fault.body, dict) else fault


def assert_no_canary(response_body: str, caplog: pytest.LogCaptureFixture) -> None:
    assert CANARY not in response_body
    assert CANARY not in caplog.text
    for record in caplog.records:
        assert CANARY not in record.getMessage()
    dump = io.StringIO()
    call_command("dumpdata", stdout=dump)
    assert CANARY not in dump.getvalue()


@pytest.mark.parametrize("kind", ["openai_compatible", "anthropic", "gemini"])
@pytest.mark.parametrize("case", [*CASES, "hang"])
def test_canary_never_escapes(
    kind: str,
    case: str,
    client: APIClient,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    vendor = VENDOR_OF_KIND[kind]
    upstream_chain(("up", kind, {"max_retries": 1, "timeout_s": 0.5}))
    fault = Faults.hang() if case == "hang" else echoing(CASES[case][0](vendor))
    fake_upstream.script(vendor, fault, fault)
    response = client.post("/audit/", {"task": "t", "input_text": "x"}, format="json")
    assert response.status_code == 200
    assert fake_upstream.requests[0].headers  # the key really went out ...
    sent = fake_upstream.requests[0].headers
    assert CANARY in (
        sent.get("authorization", "") + sent.get("x-api-key", "") + sent.get("x-goog-api-key", "")
    )
    assert_no_canary(response.content.decode(), caplog)  # ... and came back nowhere


def test_echoed_key_in_an_error_message_is_redacted(
    client: APIClient, fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("up", "openai", {}))
    fake_upstream.script("openai", Faults.auth("openai", echo_key=True))
    data = client.post("/audit/", {"task": "t", "input_text": "x"}, format="json").json()
    assert data["result"]["error"]["message"] == "Incorrect API key provided: [redacted]"


class Leaky(BaseProvider):
    """A buggy custom adapter that puts the key into its exception."""

    kind = "leaky"

    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        raise RuntimeError(f"I hold {api_key}")


@override_settings(LLM_ROUTING={"PROVIDER_KINDS": {"leaky": "tests.test_secrets_upstream.Leaky"}})
def test_an_adapter_that_raises_with_the_key_leaks_nothing(
    client: APIClient, upstream_chain: Callable[..., list[Any]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    upstream_chain(("lk", "leaky", {}))
    response = client.post("/audit/", {"task": "t", "input_text": "x"}, format="json")
    data = response.json()
    assert data["result"]["error"]["category"] == "response"
    assert "RuntimeError" in caplog.text  # the traceback was logged ...
    assert_no_canary(response.content.decode(), caplog)  # ... without the key
