"""Issue 22, finding 4 — a caller sees only what they may use (``access.may_see``):
explain, ``/health/``, ``/v1/models``, ``/v1`` errors and ``POST /audit/`` (its
refusals and its ``routing_metadata``) answer "not yours" exactly as "does not exist".
Over real HTTP to the fake upstream (tests/fakes/upstream.py)."""

from __future__ import annotations

import json
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
    assert [c["provider"] for c in body["candidates"]] == ["pub", "mock"]  # no rule: default
    assert body["router_mode"] == "default" and body["rule"] is None

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
        assert hidden(" ".join(f"{k}: {v}" for k, v in resp.items())), dict(resp.items())
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


# --- explain: a rule I may not use is no rule ----------------------------------------------


def test_explain_answers_a_rule_i_may_not_use_as_no_rule(
    api: APIClient, user: Any, staff: APIClient, rows: dict[str, Provider]
) -> None:
    """A route key or a task glob whose rule leads to a chain the caller may not use
    explains exactly as a route key or task no rule matches (``router_mode`` default,
    the default chain) — and /audit/ routes it so."""
    RoutingRule.objects.create(
        name="secret-tasks", task_glob="secret-*", chain=Chain.objects.get(name="premium")
    )

    def explained(client: APIClient, **query: str) -> dict[str, Any]:
        resp = client.get("/audit/explain/", {"task": "t", **query})
        assert resp.status_code == 200
        return dict(resp.json())

    assert explained(api, route="gold") == explained(api, route="nowhere")
    assert explained(api, task="secret-plan") == explained(api, task="plain-plan")
    assert explained(api, route="gold")["router_mode"] == "default"

    gold, nowhere = (
        api.post("/audit/", {"task": "t", "input_text": "x", "route": r}, "json").json()
        for r in ("gold", "nowhere")
    )
    for body in (gold, nowhere):
        meta = body["routing_metadata"]
        assert (meta["router_mode"], meta["chain_name"], body["result"]["provider"]) == (
            "default",
            "main",
            "pub",
        )
    assert hidden(json.dumps(gold))
    for allowed in (staff, member(user)):  # for them the rules apply
        assert explained(allowed, route="gold")["rule"] == "to-premium"
        assert explained(allowed, task="secret-plan")["rule"] == "secret-tasks"


# --- POST /audit/ ----------------------------------------------------------------------------


def test_audit_answers_absent_and_not_yours_alike(
    user: Any, rows: dict[str, Provider], fake_upstream: FakeUpstream
) -> None:
    """A provider (``provider``, ``force_provider`` with the permission to force) or a
    chain the caller may not use is the 404 of one that does not exist — the same
    status, code and words, sync, stream or async — where it was a 403 naming it.
    Forcing without the permission is a 403 whatever the name."""
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="force_provider"))
    forcer = client_for(type(user).objects.get(pk=user.pk))
    base = {"task": "t", "input_text": "x"}
    shapes = set()
    for field, names in (
        ("provider", ("vip", "lone", "ghost")),
        ("force_provider", ("vip", "lone", "ghost")),
        ("chain", ("premium", "nowhere")),
    ):
        for name in names:
            for extra in ({}, {"stream": True}, {"async": True}):
                resp = forcer.post("/audit/", {**base, field: name, **extra}, "json")
                assert resp.status_code == 404, (field, name, extra)
                text = resp.json()["detail"].replace(repr(name), "X")
                shapes.add((field == "chain", text))
                assert hidden(resp.content.decode().replace(repr(name), ""))
    assert shapes == {
        (False, "No provider X that you may use."),
        (True, "No chain X that you may use."),
    }
    assert fake_upstream.requests == [] and RoutingDecision.objects.count() == 0
    bob = client_for(type(user).objects.create_user("bob", "b@x.io", "pw"))
    for name in ("vip", "ghost", "pub"):  # no permission to force: 403, whatever the name
        resp = bob.post("/audit/", {**base, "force_provider": name}, "json")
        assert resp.status_code == 403 and "force_provider" in resp.json()["detail"]


def test_audit_metadata_names_no_provider_i_may_not_use(
    api: APIClient,
    user: Any,
    staff: APIClient,
    rows: dict[str, Provider],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The default chain (``vip``, then ``pub``) is limited: the walk skips both as
    ``not_allowed`` and the mock answers. The caller's envelope (sync, stream result,
    async job) leaves the skips out — ``pub``'s too, a provider they may name, so not
    even the chain's limit shows — and names neither provider nor chain; the decision
    row keeps them for operators; staff see it whole."""
    Chain.objects.filter(name="main").update(is_default=False)
    Chain.objects.filter(name="premium").update(is_default=True)
    ChainEntry.objects.create(chain=Chain.objects.get(name="premium"), provider=rows["pub"],
                              position=1)  # fmt: skip
    base = {"task": "t", "input_text": "x"}

    whole = api.post("/audit/", base, "json")
    streamed = api.post("/audit/", {**base, "stream": True}, "json")
    text = b"".join(streamed.streaming_content).decode()  # type: ignore[attr-defined]
    result = json.loads(text.split("event: result\ndata: ", 1)[1].split("\n\n", 1)[0])
    with django_capture_on_commit_callbacks(execute=True):  # jobs are queued on commit
        job = api.post("/audit/", {**base, "async": True}, "json")
    assert job.status_code == 202
    polled = api.get(job["Location"]).json()
    for body in (whole.json(), result, polled):
        assert body["result"]["provider"] == "mock"
        meta = body["routing_metadata"]
        assert meta["skipped_providers"] == [] and meta["chain"] == ["mock"]
        assert meta["chain_name"] is None and meta["fallback_reason"] is None
        assert hidden(json.dumps(body)), body
    for body in (whole.json(), result, polled):
        assert "pub" not in json.dumps(body["routing_metadata"])
    decision = RoutingDecision.objects.get(request_id=whole.json()["request_id"])
    assert list(decision.attempts.values_list("provider", "reason")) == [
        ("vip", "not_allowed"),
        ("pub", "not_allowed"),
        ("mock", ""),
    ]
    assert decision.chain_name == "premium"

    explained = api.get("/audit/explain/", {"task": "t"}).json()  # what /audit/ shows
    assert [c["provider"] for c in explained["candidates"]] == ["mock"]
    assert explained["chain_name"] is None and hidden(json.dumps(explained))
    seen = staff.post("/audit/", base, "json").json()  # staff may use the chain
    assert seen["result"]["provider"] == "vip"
    assert seen["routing_metadata"]["chain_name"] == "premium"


@pytest.mark.django_db(transaction=True)
def test_audit_hides_alike_on_both_faces(user: Any, rows: dict[str, Provider]) -> None:
    """The ASGI face (admitted on the event loop) answers /audit/ as the WSGI one: the
    same 404 for a provider I may not use, the same envelope without the skip."""
    from tests.test_api_async import assert_same, both_faces

    token = f"Token {Token.objects.create(user=user).key}"
    body = {"task": "t", "input_text": "x", "provider": "vip"}
    sync, asynch = both_faces("post", "/audit/", body, token=token)
    assert_same(sync, asynch, status=404)
    Chain.objects.filter(name="main").update(is_default=False)
    Chain.objects.filter(name="premium").update(is_default=True)
    sync, asynch = both_faces("post", "/audit/", {"task": "t", "input_text": "x"}, token=token)
    assert (sync.status_code, asynch.status_code) == (200, 200)
    for resp in (sync, asynch):
        meta = json.loads(resp.content)["routing_metadata"]
        assert meta["skipped_providers"] == [] and hidden(resp.content.decode())


def test_explain_names_no_hidden_provider_in_affinity_or_hedge(
    user: Any, rows: dict[str, Provider]
) -> None:
    """A provider the caller may not see is not named where explain says who served an
    affinity key or who would hedge (as null)."""
    from dataclasses import replace

    from llm_routing.access import viewer_for
    from llm_routing.api.explain_views import visible_explanation
    from llm_routing.explanation import AffinityExplanation, HedgeExplanation
    from llm_routing.router import explain
    from llm_routing.types import AuditRequest

    ex = replace(
        explain(AuditRequest(task="t", input_text="")),
        affinity=(AffinityExplanation(0, "vip", "pub", "moved"),),
        hedge=HedgeExplanation(400, 400.0, "pub", "vip"),
    )
    shown = visible_explanation(ex, viewer_for(user))
    assert shown["affinity"] == [
        {"step": 0, "remembered": None, "serves": "pub", "outcome": "moved"}
    ]
    assert shown["hedge"] == {"hedge_after_ms": 400, "after_ms": 400.0, "primary": "pub",
                              "candidate": None, "reason": None}  # fmt: skip
    assert ex.to_dict()["hedge"]["candidate"] == "vip"  # an operator's copy names it
