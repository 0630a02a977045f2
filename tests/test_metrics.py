"""GET /metrics: off by default, bearer-protected, and exact after a scripted walk.

The walk runs real adapters against the fake upstream: the primary answers 503 (three
times: one attempt and two retries) → the fallback serves; a disabled row is skipped;
the primary's circuit then opens (threshold 1) and the second request skips it. The
exposition is parsed with prometheus-client's own parser; counters are compared as
differences (the registry lives for the whole test process), the gauge as is.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import genai_prices
import pytest
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from llm_routing.router import route
from llm_routing.types import AuditRequest
from tests.conftest import FakeClock, Sleeps
from tests.fakes.upstream import FakeUpstream, Faults

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-0123456789"
ON = {"DEFAULT_CHAIN": [], "METRICS_TOKEN": TOKEN, "BREAKER_FAILURE_THRESHOLD": 1}
REQUEST = AuditRequest(task="summarize", input_text="Some input text.")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-metrics-test-123456")


def scrape(client: Client) -> Samples:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.status_code
    assert response["Content-Type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return (name, frozenset(labels.items()))


def delta(after: Samples, before: Samples) -> dict[Any, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def test_metrics_are_404_without_a_token(client: Client) -> None:
    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer anything").status_code == 404


@override_settings(LLM_ROUTING=ON)
@pytest.mark.parametrize(
    "header", [None, "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"]
)
def test_metrics_need_the_bearer_token(client: Client, header: str | None) -> None:
    extra = {} if header is None else {"HTTP_AUTHORIZATION": header}
    response = client.get("/metrics", **extra)
    assert response.status_code == 401
    assert b"llm_routing" not in response.content


@override_settings(LLM_ROUTING=ON)
def test_scripted_walk_gives_exact_values(
    client: Client,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
    clock: FakeClock,
) -> None:
    upstream_chain(
        ("oa", "openai", {"model": "gpt-4o-mini"}),
        ("dis", "openai", {"model": "gpt-4o", "enabled": False}),
        ("an", "anthropic", {"model": "claude-3-5-haiku-latest"}),
    )
    before = scrape(client)
    fake_upstream.script("openai", *[Faults.unavailable("openai", 503)] * 3)
    first = route(REQUEST, sleeper=Sleeps())
    second = route(REQUEST, sleeper=Sleeps())
    assert [(a.provider, a.outcome, a.reason) for a in first.metadata.attempts] == [
        ("oa", "error", "unavailable"),
        ("dis", "skipped", "disabled"),
        ("an", "ok", None),
    ]
    assert [(a.provider, a.outcome, a.reason) for a in second.metadata.attempts] == [
        ("oa", "skipped", "circuit_open"),
        ("dis", "skipped", "disabled"),
        ("an", "ok", None),
    ]
    after = scrape(client)
    changed = delta(after, before)

    haiku = "claude-3-5-haiku-latest"
    one = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=12, output_tokens=8), haiku, provider_id="anthropic"
    ).total_price
    counters = {
        k: v
        for k, v in changed.items()
        if not k[0].endswith(("_bucket", "_created")) and k[0] != "llm_routing_circuit_state"
    }
    duration = "gen_ai_client_operation_duration_seconds"
    usage = "gen_ai_client_token_usage"
    request_duration = "llm_routing_request_duration_seconds"
    status = first.result.status
    assert status == second.result.status == "ok"
    request_labels = {"chain": "default", "router_mode": "default", "outcome": status}
    expected = {
        key("llm_routing_requests_total", **request_labels): 2,
        key(f"{request_duration}_count", **request_labels): 2,
        key(
            "llm_routing_attempts_total",
            provider="oa",
            model="gpt-4o-mini",
            outcome="error",
            error_category="unavailable",
        ): 1,
        key(
            "llm_routing_attempts_total",
            provider="an",
            model=haiku,
            outcome="ok",
            error_category="",
        ): 2,
        key("llm_routing_skips_total", provider="dis", reason="disabled"): 2,
        key("llm_routing_skips_total", provider="oa", reason="circuit_open"): 1,
        key("llm_routing_fallbacks_total", reason="unavailable"): 1,
        key("llm_routing_fallbacks_total", reason="circuit_open"): 1,
        key("llm_routing_tokens_total", provider="an", model=haiku, token_type="input"): 24,
        key("llm_routing_tokens_total", provider="an", model=haiku, token_type="output"): 16,
        key("llm_routing_cost_usd_total", provider="an", model=haiku): float(2 * one),
        key(
            f"{duration}_count",
            gen_ai_provider_name="oa",
            gen_ai_request_model="gpt-4o-mini",
            error_type="unavailable",
        ): 1,
        key(
            f"{duration}_count",
            gen_ai_provider_name="an",
            gen_ai_request_model=haiku,
            error_type="",
        ): 2,
        key(
            f"{usage}_count",
            gen_ai_provider_name="an",
            gen_ai_request_model=haiku,
            gen_ai_token_type="input",
        ): 2,
        key(
            f"{usage}_sum",
            gen_ai_provider_name="an",
            gen_ai_request_model=haiku,
            gen_ai_token_type="input",
        ): 24,
        key(
            f"{usage}_count",
            gen_ai_provider_name="an",
            gen_ai_request_model=haiku,
            gen_ai_token_type="output",
        ): 2,
        key(
            f"{usage}_sum",
            gen_ai_provider_name="an",
            gen_ai_request_model=haiku,
            gen_ai_token_type="output",
        ): 16,
    }
    sums = {k for k in counters if k[0].endswith("_sum") and k[0] != f"{usage}_sum"}
    got = {k: v for k, v in counters.items() if k not in sums}
    assert got == pytest.approx(expected)
    # Durations are real time: only their presence is exact.
    assert {k[0] for k in sums} == {f"{duration}_sum", f"{request_duration}_sum"}
    # A token-usage bucket: 12 input tokens fall in le=16 (not in le=4).
    assert (
        changed[
            key(
                f"{usage}_bucket",
                gen_ai_provider_name="an",
                gen_ai_request_model=haiku,
                gen_ai_token_type="input",
                le="16.0",
            )
        ]
        == 2
    )
    assert (
        key(
            f"{usage}_bucket",
            gen_ai_provider_name="an",
            gen_ai_request_model=haiku,
            gen_ai_token_type="input",
            le="4.0",
        )
        not in changed
    )
    # The circuit gauge is read from the breaker at scrape time.
    assert after[key("llm_routing_circuit_state", provider="oa", model="gpt-4o-mini")] == 2
    assert after[key("llm_routing_circuit_state", provider="an", model=haiku)] == 0
    assert not any(
        k[0] == "llm_routing_circuit_state" and ("provider", "dis") in k[1] for k in after
    )
    assert one > Decimal(0)


def test_the_grafana_dashboard_uses_only_these_metrics() -> None:
    import json
    import re
    from pathlib import Path

    from llm_routing import metrics

    families = {m.name for m in metrics.REGISTRY.collect()}
    path = Path(__file__).resolve().parent.parent / "docs" / "grafana-dashboard.json"
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {
        re.sub(r"_(bucket|sum|count|total)$", "", name)
        for e in exprs
        for name in re.findall(r"\b((?:llm_routing|gen_ai)_[a-z_]+)", e)
    }
    labels = {"gen_ai_provider_name", "gen_ai_request_model", "gen_ai_token_type"}
    used -= labels
    known = {re.sub(r"_total$", "", f) for f in families}
    assert used and used <= known, used - known
    assert {"llm_routing_fallbacks", "llm_routing_cost_usd", "llm_routing_circuit_state"} <= used


@override_settings(LLM_ROUTING=ON)
def test_label_values_are_bounded(client: Client) -> None:
    before = scrape(client)
    routed = route(
        AuditRequest(task="t", input_text="x", provider="typo-from-a-caller"), sleeper=Sleeps()
    )
    assert routed.metadata.attempts[0].reason == "unknown_provider"
    after = scrape(client)
    changed = delta(after, before)
    assert changed[key("llm_routing_skips_total", provider="other", reason="unknown_provider")] == 1
    assert not any("typo-from-a-caller" in v for k in after for _, v in k[1])
    assert not any(routed.request_id in v for k in after for _, v in k[1])


@override_settings(LLM_ROUTING=ON)
def test_a_stream_counts_its_time_to_first_chunk(
    client: Client,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
) -> None:
    from llm_routing.router import route_stream
    from llm_routing.types import StreamResult

    upstream_chain(("oa", "openai", {"model": "gpt-4o-mini"}))
    before = scrape(client)
    request = AuditRequest(task="t", input_text="Stream this.", stream=True)
    events = list(route_stream(request, sleeper=Sleeps()))
    assert isinstance(events[-1], StreamResult) and events[-1].routed.result.ok
    changed = delta(scrape(client), before)
    ttft = "gen_ai_client_operation_time_to_first_chunk_seconds"
    labels = {"gen_ai_provider_name": "oa", "gen_ai_request_model": "gpt-4o-mini"}
    assert changed[key(f"{ttft}_count", **labels)] == 1
    served = events[-1].routed.metadata.attempts[-1]
    assert changed[key(f"{ttft}_sum", **labels)] == pytest.approx(served.latency_ms / 1000)
    usage = events[-1].routed.result.usage
    assert usage.output_tokens > 0
    assert (
        changed[key("llm_routing_tokens_total", provider="oa", model="gpt-4o-mini",
                    token_type="output")]
        == usage.output_tokens
    )  # fmt: skip


@override_settings(LLM_ROUTING=ON)
def test_the_children_cache_starts_again_past_its_bound(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The labelled children are cached per family; past CHILDREN_MAX the cache starts
    again and nothing counted is lost (the family keeps its children)."""
    from llm_routing import metrics

    monkeypatch.setattr(metrics, "CHILDREN_MAX", 1)
    metrics._requests.children.clear()
    before = scrape(client)
    explicit = AuditRequest(task="t", input_text="x", provider="mock")
    default = AuditRequest(task="t", input_text="x")
    for request in (explicit, default, explicit):  # two label sets through a cache of one
        route(request, sleeper=Sleeps())
    assert len(metrics._requests.children) == 1
    changed = delta(scrape(client), before)
    served = {k: v for k, v in changed.items() if k[0] == "llm_routing_requests_total"}
    assert sorted(served.values()) == [1, 2], served
