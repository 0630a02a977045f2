"""Issue 22, finding 4 — a caller sees only what they may use (``access.may_see``):
explain, ``/health/``, ``/v1/models`` and ``/v1`` errors answer "not yours" exactly as
"does not exist". Over real HTTP to the fake upstream (tests/fakes/upstream.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.test import override_settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from llm_routing.models import Chain, ChainEntry, Provider, RoutingDecision, RoutingRule
from tests.conftest import upstream_fields
from tests.fakes.upstream import FakeUpstream, Faults

pytestmark = pytest.mark.django_db

MESSAGES = [{"role": "user", "content": "hi"}]
TOKEN = "health-probe-token-0123456789"


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-visibility-test-123456")


def client_for(user: Any) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def rows(fake_upstream: FakeUpstream) -> dict[str, Provider]:
    """``pub`` in the open default chain ``main``; ``vip`` only in chain ``premium``
    (group ``vips``), which the rule of route ``gold`` leads to; ``lone`` in no chain."""

    def make(name: str) -> Provider:
        fields = upstream_fields(name, "openai_compatible", fake_upstream)
        return Provider.objects.create(**{**fields, "model": f"{name}-model", "max_retries": 0})

    out = {name: make(name) for name in ("pub", "vip", "lone")}
    main = Chain.objects.create(name="main", is_default=True)
    ChainEntry.objects.create(chain=main, provider=out["pub"], position=0)
    premium = Chain.objects.create(name="premium")
    ChainEntry.objects.create(chain=premium, provider=out["vip"], position=0)
    premium.allowed_groups.add(Group.objects.create(name="vips"))
    RoutingRule.objects.create(name="to-premium", route="gold", chain=premium)
    return out


@pytest.fixture
def staff(django_user_model: Any) -> APIClient:
    return client_for(django_user_model.objects.create_user("ops", "o@x.io", "pw", is_staff=True))


def member(user: Any) -> APIClient:
    user.groups.add(Group.objects.get(name="vips"))
    return client_for(type(user).objects.get(pk=user.pk))


def hidden(text: str) -> bool:
    """None of what the plain caller may not use is named."""
    return not any(name in text for name in ("vip", "premium", "lone"))


# --- explain ---------------------------------------------------------------------------------


def test_explain_answers_a_restricted_chain_as_one_that_does_not_exist(
    api: APIClient, user: Any, staff: APIClient, rows: dict[str, Provider]
) -> None:
    restricted = api.get("/audit/explain/", {"task": "t", "chain": "premium"})
    absent = api.get("/audit/explain/", {"task": "t", "chain": "nowhere"})
    assert restricted.status_code == absent.status_code == 404
    assert restricted.json()["detail"].replace("premium", "X") == absent.json()["detail"].replace(
        "nowhere", "X"
    )
    assert hidden(restricted.content.decode().replace("'premium'", ""))

    for allowed in (staff, member(user)):  # staff, and a member of the chain's group
        seen = allowed.get("/audit/explain/", {"task": "t", "chain": "premium"})
        assert seen.status_code == 200
        assert [c["provider"] for c in seen.json()["candidates"]] == ["vip", "mock"]


def test_explain_of_a_route_or_provider_i_may_not_use_names_nothing_of_it(
    api: APIClient, rows: dict[str, Provider]
) -> None:
    route = api.get("/audit/explain/", {"task": "t", "route": "gold"})
    assert route.status_code == 200
    body = route.json()
    assert hidden(route.content.decode().replace('"gold"', ""))
    assert [c["provider"] for c in body["candidates"]] == ["mock"]
    assert body["chain_name"] is None and body["rule"] is None

    # A provider I may not use reads exactly as one that does not exist.
    mine, absent = (
        api.get("/audit/explain/", {"task": "t", "provider": name}).json()
        for name in ("vip", "ghost")
    )
    assert mine["candidates"][0] == {**absent["candidates"][0], "provider": "vip"}
    assert mine["candidates"][0]["reason"] == "unknown_provider"
    assert [c["provider"] for c in mine["candidates"][1:]] == ["pub", "mock"]


# --- /health/ --------------------------------------------------------------------------------


def test_health_is_a_summary_for_callers_and_the_full_list_for_operators(
    api: APIClient, staff: APIClient, rows: dict[str, Provider]
) -> None:
    summary = api.get("/health/")
    assert summary.status_code == 200
    assert summary.json() == {"status": "ok", "cache": "ok"}

    full = staff.get("/health/").json()
    assert {p["name"] for p in full["providers"]} == {"pub", "vip", "lone"}
    assert all("key_present" in p for p in full["providers"])

    probe = APIClient()  # no user: the METRICS_TOKEN alone
    with override_settings(LLM_ROUTING={"METRICS_TOKEN": TOKEN}):
        assert probe.get("/health/").status_code == 401
        wrong = probe.get("/health/", HTTP_AUTHORIZATION="Bearer not-the-token")
        assert wrong.status_code == 401
        token = probe.get("/health/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert token.status_code == 200
        assert {p["name"] for p in token.json()["providers"]} == {"pub", "vip", "lone"}
        assert api.get("/health/").json() == {"status": "ok", "cache": "ok"}


# --- /v1 -------------------------------------------------------------------------------------


def test_v1_answers_absent_and_not_yours_alike(
    api: APIClient, user: Any, rows: dict[str, Provider], fake_upstream: FakeUpstream
) -> None:
    answers = {
        model: api.post("/v1/chat/completions", {"model": model, "messages": MESSAGES}, "json")
        for model in ("premium", "vip", "lone", "gold", "nowhere")
    }
    shapes = set()
    for model, resp in answers.items():
        assert resp.status_code == 404, model
        error = resp.json()["error"]
        shapes.add((error["type"], error["code"], error["message"].replace(repr(model), "X")))
    assert len(shapes) == 1, shapes
    assert fake_upstream.requests == [] and RoutingDecision.objects.count() == 0

    ok = member(user).post("/v1/chat/completions", {"model": "gold", "messages": MESSAGES}, "json")
    assert ok.status_code == 200 and ok["X-LLM-Provider"] == "vip"


def test_v1_models_lists_only_routes_chains_and_providers_i_may_use(
    api: APIClient, user: Any, staff: APIClient, rows: dict[str, Provider]
) -> None:
    listed = {m["id"] for m in api.get("/v1/models").json()["data"]}
    assert listed == {"main", "pub", "mock"}
    listed = {m["id"] for m in member(user).get("/v1/models").json()["data"]}
    assert listed == {"main", "premium", "gold", "pub", "vip", "mock"}
    listed = {m["id"] for m in staff.get("/v1/models").json()["data"]}
    assert listed == {"main", "premium", "gold", "pub", "vip", "lone", "mock"}


def test_a_503_names_no_provider_i_may_not_use(
    api: APIClient, staff: APIClient, rows: dict[str, Provider], fake_upstream: FakeUpstream
) -> None:
    """``pub`` in an open chain fails; the default chain (only ``vip``) is limited: the
    503 of a plain caller names ``pub`` and not ``vip``."""
    Chain.objects.filter(name="main").update(is_default=False)
    premium = Chain.objects.get(name="premium")
    premium.is_default = True
    premium.save()
    body = {"model": "pub", "messages": MESSAGES}
    for stream in (False, True):
        fake_upstream.script("openai", Faults.unavailable("openai"))
        resp = api.post("/v1/chat/completions", {**body, "stream": stream}, "json")
        assert resp.status_code == 503, stream
        error = resp.json()["error"]
        assert [c["provider"] for c in error["candidates"]] == ["pub"]
        assert hidden(resp.content.decode())
    fake_upstream.script("openai", Faults.unavailable("openai"), Faults.unavailable("openai"))
    seen = staff.post("/v1/chat/completions", body, "json")  # staff may use both
    assert seen.status_code == 503
    assert [c["provider"] for c in seen.json()["error"]["candidates"]] == ["pub", "vip"]


@pytest.mark.django_db(transaction=True)
def test_both_faces_answer_absent_and_not_yours_alike(
    user: Any, rows: dict[str, Provider], fake_upstream: FakeUpstream
) -> None:
    """The ASGI face admits on the event loop; it hides the same names with the same 404."""
    from tests.test_api_async import assert_same, both_faces

    token = f"Token {Token.objects.create(user=user).key}"
    for model in ("premium", "gold", "vip", "nowhere"):
        body = {"model": model, "messages": MESSAGES}
        sync, asynch = both_faces("post", "/v1/chat/completions", body, token=token)
        assert_same(sync, asynch, status=404)
        assert asynch.json()["error"]["code"] == "model_not_found"
    sync, asynch = both_faces("get", "/health/", token=token)
    assert_same(sync, asynch, status=200)
    assert asynch.json() == {"status": "ok", "cache": "ok"}
    assert fake_upstream.requests == []
