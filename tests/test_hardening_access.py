"""Issue 11, part B (item 4) — who may route where: permissions, chain access lists,
403s with the reason, ``not_allowed`` skips, and forced calls under the circuit and the
attempt budget. Over real HTTP to the fake upstream (tests/fakes/upstream.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from llm_routing.models import Chain, ChainEntry, Provider, RoutingDecision, RoutingRule
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import OPEN
from llm_routing.router import route
from llm_routing.types import AuditRequest, Principal
from tests.breaker_support import FakeClock
from tests.conftest import Sleeps, upstream_fields
from tests.fakes.upstream import FakeUpstream, Faults

pytestmark = pytest.mark.django_db

BODY = {"task": "summarize", "input_text": "Some input text."}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-access-test-123456")


def client_for(user: Any) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def rows(fake_upstream: FakeUpstream) -> dict[str, Provider]:
    """``pub`` in the open default chain, ``vip`` only in chain ``premium`` (limited to
    group ``vips``), ``lone`` in no chain. All openai_compatible rows on the fake."""

    def make(name: str) -> Provider:
        return Provider.objects.create(**upstream_fields(name, "openai_compatible", fake_upstream))

    out = {name: make(name) for name in ("pub", "vip", "lone")}
    default = Chain.objects.create(name="main", is_default=True)
    ChainEntry.objects.create(chain=default, provider=out["pub"], position=0)
    premium = Chain.objects.create(name="premium")
    ChainEntry.objects.create(chain=premium, provider=out["vip"], position=0)
    premium.allowed_groups.add(Group.objects.create(name="vips"))
    RoutingRule.objects.create(name="to-premium", route="gold", chain=premium)
    return out


def grant(user: Any, codename: str) -> Any:
    user.user_permissions.add(Permission.objects.get(codename=codename))
    return type(user).objects.get(pk=user.pk)  # a fresh instance: no cached permissions


def detail(resp: Any) -> str:
    return str(resp.json()["detail"])


# --- 403 with the reason ---------------------------------------------------------------------


def test_force_provider_needs_the_permission(
    api: APIClient, user: Any, rows: dict[str, Provider], fake_upstream: FakeUpstream
) -> None:
    resp = api.post("/audit/", {**BODY, "force_provider": "pub"}, format="json")
    assert resp.status_code == 403
    assert "llm_routing.force_provider" in detail(resp)
    assert fake_upstream.requests == [] and RoutingDecision.objects.count() == 0
    async_resp = api.post("/audit/", {**BODY, "force_provider": "pub", "async": True}, "json")
    assert async_resp.status_code == 403

    allowed = client_for(grant(user, "force_provider"))
    resp = allowed.post("/audit/", {**BODY, "force_provider": "pub"}, format="json")
    assert resp.status_code == 200 and resp.json()["result"]["provider"] == "pub"


def test_naming_a_provider_outside_my_chains_needs_the_permission(
    api: APIClient, user: Any, rows: dict[str, Provider], fake_upstream: FakeUpstream
) -> None:
    for name in ("lone", "vip", "ghost"):  # in no chain / in a chain I may not use / absent
        # Issue 22: the 404 of a provider that does not exist (tests/test_visibility.py).
        resp = api.post("/audit/", {**BODY, "provider": name}, format="json")
        assert resp.status_code == 404, name
        assert detail(resp) == f"No provider {name!r} that you may use."
    assert fake_upstream.requests == []
    resp = api.post("/audit/", {**BODY, "provider": "pub"}, format="json")
    assert resp.status_code == 200 and resp.json()["result"]["provider"] == "pub"

    user.groups.add(Group.objects.get(name="vips"))  # now premium is one of my chains
    resp = client_for(user).post("/audit/", {**BODY, "provider": "vip"}, format="json")
    assert resp.status_code == 200 and resp.json()["result"]["provider"] == "vip"

    anywhere = client_for(grant(user, "route_any_provider"))
    resp = anywhere.post("/audit/", {**BODY, "provider": "lone"}, format="json")
    assert resp.status_code == 200 and resp.json()["result"]["provider"] == "lone"


def test_staff_may_force_and_name_any_provider(
    django_user_model: Any, rows: dict[str, Provider]
) -> None:
    staff = client_for(django_user_model.objects.create_user("ops", "o@x.io", "pw", is_staff=True))
    resp = staff.post("/audit/", {**BODY, "force_provider": "lone"}, format="json")
    assert resp.status_code == 200 and resp.json()["result"]["provider"] == "lone"
    resp = staff.post("/audit/", {**BODY, "provider": "vip"}, format="json")
    assert resp.status_code == 200 and resp.json()["result"]["provider"] == "vip"


def test_v1_refusals_use_openais_envelope(
    api: APIClient, user: Any, rows: dict[str, Provider]
) -> None:
    """On /v1 what the caller may not use is answered as what does not exist (issue 22:
    a 404, so names cannot be enumerated; tests/test_visibility.py)."""
    messages = [{"role": "user", "content": "hi"}]
    for model in ("premium", "lone"):
        resp = api.post("/v1/chat/completions", {"model": model, "messages": messages}, "json")
        assert resp.status_code == 404, model
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "model_not_found"
    user.groups.add(Group.objects.get(name="vips"))
    ok = client_for(user).post(
        "/v1/chat/completions", {"model": "premium", "messages": messages}, format="json"
    )
    assert ok.status_code == 200 and ok["X-LLM-Provider"] == "vip"


# --- the chain walk: a recorded not_allowed skip ------------------------------------------------


def test_a_rule_leading_to_a_chain_i_may_not_use_does_not_apply_to_me(
    api: APIClient, user: Any, rows: dict[str, Provider], fake_upstream: FakeUpstream
) -> None:
    """Issue 22: such a rule is skipped when the plan is made (as if it did not exist),
    so the caller is routed as for an unknown route key: the default chain. The
    recorded ``not_allowed`` skip of a limited default chain:
    tests/test_visibility.py::test_audit_metadata_names_no_provider_i_may_not_use."""
    resp = api.post("/audit/", {**BODY, "route": "gold"}, format="json")
    assert resp.status_code == 200
    body = resp.json()
    assert body["routing_metadata"]["skipped_providers"] == []
    assert body["result"]["provider"] == "pub"
    assert body["routing_metadata"]["router_mode"] == "default"
    assert body["routing_metadata"]["rule"] is None
    decision = RoutingDecision.objects.get(request_id=body["request_id"])
    assert list(decision.attempts.values_list("provider", "reason")) == [("pub", "")]

    user.groups.add(Group.objects.get(name="vips"))
    resp = client_for(user).post("/audit/", {**BODY, "route": "gold"}, format="json")
    assert resp.json()["result"]["provider"] == "vip"


def test_the_python_api_without_a_principal_is_trusted(rows: dict[str, Provider]) -> None:
    trusted = route(AuditRequest(task="t", input_text="x", route="gold"), sleeper=Sleeps())
    assert trusted.result.provider == "vip"
    stranger = AuditRequest(task="t", input_text="x", route="gold", principal=Principal(user_id=9))
    assert route(stranger, sleeper=Sleeps()).result.provider == "pub"  # the rule is not theirs
    forced = AuditRequest(task="t", input_text="x", force_provider="lone", principal=Principal())
    refused = route(forced, sleeper=Sleeps())
    assert refused.result.error is not None
    assert refused.result.error.category == "not_allowed"


# --- forced calls: the circuit and the attempt budget ----------------------------------------


def test_forced_calls_count_toward_the_circuit_and_respect_it(
    rows: dict[str, Provider], fake_upstream: FakeUpstream, clock: FakeClock
) -> None:
    forced = AuditRequest(task="debug", input_text="x", force_provider="pub")
    fake_upstream.script("openai", *[Faults.unavailable("openai")] * 9)
    for _ in range(3):
        routed = route(forced, sleeper=Sleeps())
        assert routed.result.error is not None
        assert routed.result.error.category == "unavailable"
    assert len(fake_upstream.requests) == 9  # 3 x (1 + 2 retries)
    assert breaker.store.load("pub", "openai_compatible-model").phase(clock()) == OPEN
    for _ in range(5):
        routed = route(forced, sleeper=Sleeps())
        assert routed.result.error is not None
        assert routed.result.error.category == "circuit_open"
        assert routed.metadata.skipped_providers == [{"provider": "pub", "reason": "circuit_open"}]
    assert len(fake_upstream.requests) == 9  # not one more upstream call

    clock.advance(1.0)  # half-open: the forced call is the single probe (no retries)
    routed = route(forced, sleeper=Sleeps())
    assert routed.result.ok and len(fake_upstream.requests) == 10


def test_an_async_job_runs_under_its_owners_access_rules(
    api: APIClient,
    rows: dict[str, Provider],
    fake_upstream: FakeUpstream,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):  # jobs are queued on commit
        resp = api.post("/audit/", {**BODY, "route": "gold", "async": True}, format="json")
    assert resp.status_code == 202
    job = api.get(resp.json()["status_url"]).json()
    assert job["status"] == "done"
    # The rule of route gold leads to a chain the owner may not use: it does not apply
    # to them (the default chain serves), and the job's result names nothing of it.
    assert job["result"]["provider"] == "pub"
    assert job["routing_metadata"]["skipped_providers"] == []
    assert not any(name in json.dumps(job) for name in ("vip", "premium", "to-premium"))


def test_v1_models_lists_only_what_i_may_name(
    api: APIClient, django_user_model: Any, rows: dict[str, Provider]
) -> None:
    listed = {m["id"] for m in api.get("/v1/models").json()["data"]}
    assert {"main", "pub", "mock"} <= listed
    assert not listed & {"premium", "vip", "lone", "gold"}  # gold leads to premium
    staff = client_for(django_user_model.objects.create_user("ops", "o@x.io", "pw", is_staff=True))
    listed = {m["id"] for m in staff.get("/v1/models").json()["data"]}
    assert {"main", "premium", "pub", "vip", "lone"} <= listed


def test_staff_may_use_a_limited_chain(django_user_model: Any, rows: dict[str, Provider]) -> None:
    staff = client_for(django_user_model.objects.create_user("ops", "o@x.io", "pw", is_staff=True))
    resp = staff.post("/audit/", {**BODY, "route": "gold"}, format="json")
    assert resp.json()["result"]["provider"] == "vip"


def test_applying_a_config_file_keeps_a_chains_access_list(rows: dict[str, Provider]) -> None:
    from llm_routing.config_io import apply, export

    text = export()
    assert "allowed" not in text  # access lists are not part of the file
    Chain.objects.filter(name="premium").update(description="changed")
    assert apply(text, prune=True)  # the description is put back …
    premium = Chain.objects.get(name="premium")
    assert premium.description == ""
    assert list(premium.allowed_groups.values_list("name", flat=True)) == ["vips"]  # … not this
