"""Explain-route: what the walk would do, read-only — no provider called, nothing
recorded, no circuit state touched (a half-open probe slot stays free)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import override_settings

from llm_routing.models import Chain, Provider, RoutingDecision, RoutingRule
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import OPEN, Circuit
from llm_routing.router import explain, route
from llm_routing.types import AuditRequest

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def setup(scripted: Any, key_env: str, clock: Any) -> Chain:
    a = make_provider("a", supports_streaming=True)
    b = make_provider("b", supports_streaming=False)
    c = make_provider("c", supports_streaming=True)
    chain = make_chain("main", [a, b, c], is_default=True)
    return chain


def open_circuit(name: str, *, until_in: float, clock: Any) -> None:
    row = Provider.objects.get(name=name)
    now = clock()
    breaker.store.save(
        Circuit(
            provider=name,
            model=row.model,
            state=OPEN,
            failures=3,
            level=1,
            opened_at=now,
            open_until=now + until_in,
            last_error_category="unavailable",
            last_http_status=503,
        )
    )


def verdicts(explanation: Any) -> list[tuple[str, str, str | None]]:
    return [(c.provider, c.verdict, c.reason) for c in explanation.candidates]


def test_disabled_primary_is_a_skip_and_the_next_would_try(setup, scripted):
    Provider.objects.filter(name="a").update(enabled=False)
    ex = explain(AuditRequest(task="t", input_text=""))
    assert ex.plan.router_mode == "default" and ex.plan.chain_name == "main"
    assert verdicts(ex) == [
        ("a", "skip", "disabled"),
        ("b", "try", None),
        ("c", "try", None),
        ("mock", "try", None),
    ]
    assert ex.first_try is not None and ex.first_try.provider == "b"
    assert ex.candidates[-1].backstop and ex.candidates[-1].circuit == "n/a"
    assert scripted.calls == []
    assert RoutingDecision.objects.count() == 0


def test_missing_key_and_unsupported_name_the_capability(setup, monkeypatch):
    Provider.objects.filter(name="a").update(api_key_env="UNSET_KEY_VARIABLE")
    monkeypatch.delenv("UNSET_KEY_VARIABLE", raising=False)
    ex = explain(AuditRequest(task="t", input_text="", stream=True))
    assert verdicts(ex)[:3] == [
        ("a", "skip", "missing_key"),
        ("b", "skip", "unsupported"),
        ("c", "try", None),
    ]
    assert ex.candidates[1].missing_capability == "streaming"
    structured = explain(AuditRequest(task="t", input_text="", response_schema={"type": "object"}))
    assert structured.candidates[1].missing_capability == "structured_output"


def test_open_circuit_shows_open_until_and_changes_nothing(setup, clock):
    open_circuit("a", until_in=30, clock=clock)
    before = breaker.store.load("a", "a-model")
    ex = explain(AuditRequest(task="t", input_text=""))
    first = ex.candidates[0]
    assert (first.verdict, first.reason, first.circuit) == ("skip", "circuit_open", "open")
    assert first.open_until == pytest.approx(clock() + 30)
    assert ex.to_dict()["candidates"][0]["open_until"].endswith("Z")  # type: ignore[index]
    assert breaker.store.load("a", "a-model") == before


def test_half_open_probe_slot_is_not_taken(setup, clock, scripted):
    open_circuit("a", until_in=5, clock=clock)
    clock.advance(6)  # half-open: the next call would be the probe
    ex = explain(AuditRequest(task="t", input_text=""))
    first = ex.candidates[0]
    assert (first.verdict, first.circuit, first.probe, first.max_retries) == (
        "try",
        "half_open",
        True,
        0,
    )
    explain(AuditRequest(task="t", input_text=""))  # twice: still no slot claimed
    # The real walk still gets the probe: a explain must not have claimed it.
    routed = route(AuditRequest(task="t", input_text="hi"))
    assert routed.result.provider == "a"
    assert scripted.calls[0][0] == "a"


def test_rule_forced_and_explicit_modes(setup):
    other = make_chain("other", [Provider.objects.get(name="c")])
    RoutingRule.objects.create(name="vision-rule", route="vision", chain=other)
    ruled = explain(AuditRequest(task="t", input_text="", route="vision"))
    assert (ruled.plan.router_mode, ruled.plan.rule, ruled.plan.chain_name) == (
        "rule",
        "vision-rule",
        "other",
    )
    assert [c.provider for c in ruled.candidates] == ["c", "mock"]
    Provider.objects.filter(name="b").update(enabled=False)
    forced = explain(AuditRequest(task="t", input_text="", force_provider="b"))
    assert verdicts(forced) == [("b", "skip", "disabled")]
    explicit = explain(AuditRequest(task="t", input_text="", provider="ghost"))
    assert verdicts(explicit)[0] == ("ghost", "skip", "unknown_provider")


def test_effective_limits_and_budget(setup):
    Provider.objects.filter(name="a").update(timeout_s=7.5, first_token_timeout_s=2, max_retries=4)
    with override_settings(LLM_ROUTING={"REQUEST_DEADLINE_S": 12, "MAX_ATTEMPTS": 3}):
        ex = explain(AuditRequest(task="t", input_text=""))
    first = ex.candidates[0]
    assert (first.timeout_s, first.first_token_timeout_s, first.max_retries) == (7.5, 2.0, 4)
    assert (ex.deadline_s, ex.max_attempts) == (12.0, 3)


# --- GET /audit/explain/ --------------------------------------------------------------


def test_api_explain(api, setup, scripted):
    Provider.objects.filter(name="a").update(enabled=False)
    response = api.get(
        "/audit/explain/", {"task": "t", "stream": "true", "schema": json.dumps({"type": "object"})}
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["chain_name"] == "main" and body["router_mode"] == "default"
    first, second = body["candidates"][:2]
    assert (first["provider"], first["verdict"], first["reason"]) == ("a", "skip", "disabled")
    # b lacks streaming (the first missing capability, in CAPABILITIES order)
    assert (second["reason"], second["missing_capability"]) == ("unsupported", "streaming")
    assert body["budget"]["max_attempts"] >= 1
    assert scripted.calls == []
    assert RoutingDecision.objects.count() == 0


def test_api_explain_needs_the_same_auth_and_names_bad_fields(anon, api, setup):
    assert anon.get("/audit/explain/", {"task": "t"}).status_code == 401
    bad = api.get("/audit/explain/", {"task": "not a slug", "schema": "{nope"})
    assert bad.status_code == 400
    assert set(bad.json()) == {"task", "schema"}
    both = api.get("/audit/explain/", {"task": "t", "provider": "a", "force_provider": "b"})
    assert both.status_code == 400 and "force_provider" in both.json()


def test_api_explain_is_throttled_like_audit(api, setup):
    with override_settings(LLM_ROUTING={"API_THROTTLE_RATES": {"user": "2/min", "anon": "1/min"}}):
        codes = [api.get("/audit/explain/", {"task": "t"}).status_code for _ in range(3)]
    assert codes == [200, 200, 429]


# --- the admin page -------------------------------------------------------------------


def test_admin_explain_page_shows_the_skip(admin_client, setup, scripted):
    from django.urls import reverse

    Provider.objects.filter(name="a").update(enabled=False)
    url = reverse("admin:llm_routing_explain")
    html = admin_client.get(url, {"task": "t"}).content.decode()
    assert "would serve first" in html
    table = html[html.index('id="llmr-candidates"') :]
    rows = table.split("<tr")[2:]
    assert "skip" in rows[0] and "disabled" in rows[0] and ">a<" not in rows[1]
    assert "would try" in rows[1]
    assert "/audit/explain/?task=t" in html
    assert scripted.calls == []
    bad = admin_client.get(url, {"task": "no spaces"}).content.decode()
    assert "errorlist" in bad and "Task:" in bad


def test_admin_explain_needs_staff(client, setup):
    from django.urls import reverse

    response = client.get(reverse("admin:llm_routing_explain"), {"task": "t"})
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_chain_rule_and_provider_pages_link_to_explain(admin_client, setup):
    from django.urls import reverse

    chain = Chain.objects.get(name="main")
    rule = RoutingRule.objects.create(name="sum", task_glob="summar*", chain=chain)
    provider = Provider.objects.get(name="a")
    pages = {
        "chain": (chain.pk, "chain=main"),
        "routingrule": (rule.pk, "task=summarx"),
        "provider": (provider.pk, "provider=a"),
    }
    for model, (pk, query) in pages.items():
        html = admin_client.get(reverse(f"admin:llm_routing_{model}_change", args=[pk])).content
        text = html.decode()
        assert reverse("admin:llm_routing_explain") in text, model
        assert query in text, model


def test_api_explain_names_nothing_of_a_chain_the_caller_may_not_use(api, setup, scripted):
    """The default chain is limited to a group the caller is not in: the walk would skip
    every entry as not_allowed; explain shows that caller only what they may see
    (access.may_see: the mock), and names neither the chain nor its providers."""
    from django.contrib.auth.models import Group

    setup.allowed_groups.add(Group.objects.create(name="vips"))
    body = api.get("/audit/explain/", {"task": "t"}).json()
    reasons = [(c["provider"], c["verdict"], c["reason"]) for c in body["candidates"]]
    assert reasons == [("mock", "try", None)]
    assert body["candidates"][0]["position"] == 0 and body["chain_name"] is None
    routed = api.post("/audit/", {"task": "t", "input_text": "hi"}, format="json").json()
    assert routed["result"]["provider"] == "mock"
    # The Python API has no principal: trusted, so the same explanation would try "a".
    assert explain(AuditRequest(task="t", input_text="")).candidates[0].verdict == "try"
