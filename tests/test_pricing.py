"""Cost per attempt: the price package's figure for the tokens the fake upstream
reported, per vendor kind; a provider row's override wins; an unknown price is null;
a failed attempt that consumed tokens is charged. Checked on the RoutingResult's costs,
the Attempt / RoutingDecision rows, POST /audit/'s routing_metadata and /v1's usage."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import genai_prices
import pytest
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from llm_routing import config_io, pricing
from llm_routing.models import Attempt, Provider, RoutingDecision
from llm_routing.router import route, route_stream
from llm_routing.types import AuditRequest, RoutingResult, StreamResult, Usage
from tests.conftest import Sleeps
from tests.fakes.upstream import FakeUpstream, Fault, Faults

pytestmark = pytest.mark.django_db

REQUEST = AuditRequest(task="summarize", input_text="Some input text.")


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-pricing-test-123456")


def package_price(model: str, provider_id: str, routed: RoutingResult) -> Decimal:
    usage = routed.result.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    tokens = genai_prices.Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
    return Decimal(genai_prices.calc_price(tokens, model, provider_id=provider_id).total_price)


def rows(routed: RoutingResult) -> tuple[Decimal | None, list[Decimal | None]]:
    decision = RoutingDecision.objects.get(request_id=routed.request_id)
    return decision.cost_usd, [a.cost_usd for a in decision.attempts.order_by("index")]


@pytest.mark.parametrize(
    "kind, model, provider_id",
    [
        ("openai", "gpt-4o-mini", "openai"),
        ("anthropic", "claude-3-5-haiku-latest", "anthropic"),
        ("gemini", "gemini-2.0-flash", "google"),
    ],
)
def test_cost_is_the_price_packages_for_the_reported_tokens(
    kind: str,
    model: str,
    provider_id: str,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
) -> None:
    upstream_chain(("p", kind, {"model": model}))
    routed = route(REQUEST, sleeper=Sleeps())
    assert routed.result.ok and routed.result.provider == "p"
    expected = package_price(model, provider_id, routed)
    assert expected > 0
    cost = pricing.costs(routed)
    assert cost.attempts == (expected,) and cost.total == expected
    assert rows(routed) == (expected, [expected])
    body = pricing.envelope(routed)
    assert body["routing_metadata"]["cost_usd"] == float(expected)
    assert body["routing_metadata"]["attempts"][0]["cost_usd"] == float(expected)


def test_override_row_wins(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(
        (
            "p",
            "openai",
            {
                "model": "gpt-4o-mini",
                "input_price_per_mtok": Decimal("1.5"),
                "output_price_per_mtok": Decimal("6"),
            },
        )
    )
    routed = route(REQUEST, sleeper=Sleeps())
    expected = (11 * Decimal("1.5") + 7 * Decimal("6")) / Decimal(1_000_000)
    assert routed.result.usage.input_tokens == 11 and routed.result.usage.output_tokens == 7
    assert pricing.costs(routed).total == expected
    assert rows(routed) == (expected, [expected])


def test_override_prices_a_self_hosted_server_the_package_does_not_know(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("local", "openai_compatible", {"model": "llama-local"}))
    routed = route(REQUEST, sleeper=Sleeps())
    assert routed.result.ok and pricing.costs(routed).total is None
    Provider.objects.filter(name="local").update(
        input_price_per_mtok=Decimal("0.1"), output_price_per_mtok=Decimal("0.2")
    )
    pricing.forget()  # update() sends no post_save
    routed = route(REQUEST, sleeper=Sleeps())
    assert pricing.costs(routed).total == (11 * Decimal("0.1") + 7 * Decimal("0.2")) / 1_000_000


def test_unknown_model_is_null_everywhere(
    api: APIClient, fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("p", "openai", {"model": "no-such-model-zz9"}))
    routed = route(REQUEST, sleeper=Sleeps())
    assert routed.result.ok and routed.result.usage.input_tokens == 11
    assert pricing.costs(routed).total is None
    assert rows(routed) == (None, [None])
    audit = api.post("/audit/", {"task": "t", "input_text": "x"}, format="json").json()
    assert audit["routing_metadata"]["cost_usd"] is None
    chat = api.post(
        "/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": "hi"}]},
        format="json",
    )
    assert chat.status_code == 200, chat.content
    assert chat.json()["usage"]["cost_usd"] is None
    assert chat.json()["usage"]["prompt_tokens"] == 11


def test_v1_usage_carries_the_cost(
    api: APIClient, fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("p", "openai", {"model": "gpt-4o-mini"}))
    chat = api.post(
        "/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": "hi"}]},
        format="json",
    )
    assert chat.status_code == 200, chat.content
    tokens = genai_prices.Usage(input_tokens=11, output_tokens=7)
    expected = genai_prices.calc_price(tokens, "gpt-4o-mini", provider_id="openai").total_price
    assert chat.json()["usage"]["cost_usd"] == float(expected)
    decision = RoutingDecision.objects.get()
    assert decision.cost_usd == expected


def test_a_failed_attempt_that_consumed_tokens_is_charged(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    """The upstream generated (and billed) an answer that fails the schema: the walk
    stops with a response error, and the attempt's tokens are still priced."""
    upstream_chain(("p", "openai", {"model": "gpt-4o-mini"}))
    invalid = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini-2024-fake",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "not json"},
             "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 40, "completion_tokens": 30, "total_tokens": 70},
    }  # fmt: skip
    fake_upstream.script("openai", Fault(body=invalid))
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    request = AuditRequest(task="t", input_text="x", response_schema=schema)
    routed = route(request, sleeper=Sleeps())
    assert not routed.result.ok and routed.result.error is not None
    assert routed.result.error.category == "response"
    attempt = routed.metadata.attempts[0]
    assert attempt.outcome == "error" and attempt.usage is not None
    assert (attempt.usage.input_tokens, attempt.usage.output_tokens) == (40, 30)
    tokens = genai_prices.Usage(input_tokens=40, output_tokens=30)
    expected = genai_prices.calc_price(tokens, "gpt-4o-mini", provider_id="openai").total_price
    assert expected > 0
    assert pricing.costs(routed).attempts == (expected,)
    assert rows(routed) == (expected, [expected])


def test_a_failed_attempt_without_tokens_costs_nothing_and_the_total_adds_up(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(
        ("oa", "openai", {"model": "gpt-4o-mini", "max_retries": 0}),
        ("an", "anthropic", {"model": "claude-3-5-haiku-latest"}),
    )
    fake_upstream.script("openai", Faults.unavailable("openai", 503))
    routed = route(REQUEST, sleeper=Sleeps())
    assert [a.outcome for a in routed.metadata.attempts] == ["error", "ok"]
    served = package_price("claude-3-5-haiku-latest", "anthropic", routed)
    assert pricing.costs(routed).attempts == (Decimal(0), served)
    assert rows(routed) == (served, [Decimal(0), served])
    assert Attempt.objects.filter(cost_usd__isnull=True).count() == 0


def test_a_stream_is_priced_from_its_final_usage(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("p", "openai", {"model": "gpt-4o-mini"}))
    request = AuditRequest(task="t", input_text="Stream this please.", stream=True)
    events = list(route_stream(request, sleeper=Sleeps()))
    assert isinstance(events[-1], StreamResult)
    routed = events[-1].routed
    sent = fake_upstream.requests_for("openai")[-1].json
    assert sent["stream_options"] == {"include_usage": True}
    expected = package_price("gpt-4o-mini", "openai", routed)
    assert pricing.costs(routed).total == expected
    assert rows(routed) == (expected, [expected])


def test_a_price_pair_is_both_or_neither() -> None:
    row = Provider(name="half", kind="openai", model="m", input_price_per_mtok=Decimal("1"))
    with pytest.raises(ValidationError) as info:
        row.full_clean()
    assert "output_price_per_mtok" in info.value.message_dict


def test_prices_round_trip_through_the_config_file() -> None:
    Provider.objects.create(
        name="priced",
        kind="openai",
        model="m",
        input_price_per_mtok=Decimal("0.15"),
        output_price_per_mtok=Decimal("0.6"),
    )
    text = config_io.export()
    assert "input_price_per_mtok = 0.15" in text
    assert config_io.apply(text, dry_run=True) == []
    Provider.objects.filter(name="priced").update(output_price_per_mtok=Decimal("0.7"))
    changes = config_io.apply(text)
    assert len(changes) == 1
    assert Provider.objects.get(name="priced").output_price_per_mtok == Decimal("0.6")


@pytest.mark.parametrize(
    "kind, model, provider_id",
    [
        ("openai", "gpt-4o-mini", "openai"),
        ("anthropic", "claude-3-5-haiku-latest", "anthropic"),
        ("gemini", "gemini-2.0-flash", "google"),
        ("gemini", "gemini-2.5-pro", "google"),  # tiered above 200k tokens
    ],
)
@pytest.mark.parametrize("tokens", [(0, 1), (1, 0), (11, 7), (250_000, 1_000), (9, 654_321)])
def test_a_price_is_exactly_the_packages(
    kind: str, model: str, provider_id: str, tokens: tuple[int, int]
) -> None:
    """The per-model lookup is cached (flat prices summed here, tiered ones asked of the
    package each time): the figure is the package's, to the last digit."""
    source = pricing.PriceSource(kind=kind, model=model)
    usage = genai_prices.Usage(input_tokens=tokens[0], output_tokens=tokens[1])
    expected = genai_prices.calc_price(usage, model, provider_id=provider_id).total_price
    for _ in range(2):  # a cold and a warm lookup
        got = pricing.price(source, model, Usage(*tokens))
        assert got == expected


def test_an_answer_without_reported_tokens_is_null_not_free(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("p", "openai", {"model": "gpt-4o-mini"}))
    silent: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"},
             "finish_reason": "stop"}
        ],
    }  # fmt: skip
    fake_upstream.script("openai", Fault(body=silent))  # no "usage"
    routed = route(REQUEST, sleeper=Sleeps())
    assert routed.result.ok and routed.result.usage == Usage()
    assert pricing.costs(routed).total is None
    assert rows(routed) == (None, [None])


@pytest.mark.django_db(transaction=True)
def test_inside_an_event_loop_prices_are_read_without_the_loops_orm() -> None:
    """The async serving path may not use the ORM in the loop: a name never read is
    read once in a worker thread; a stale one is served while a thread refreshes it."""
    import time

    from asgiref.sync import async_to_sync

    Provider.objects.create(
        name="p",
        kind="openai",
        model="m",
        input_price_per_mtok=Decimal("1"),
        output_price_per_mtok=Decimal("2"),
    )
    pricing.forget()

    async def look() -> pricing.PriceSource | None:
        return pricing.sources({"p"})["p"]

    cold = async_to_sync(look)()
    assert cold is not None and cold.input_per_mtok == Decimal("1")

    Provider.objects.filter(name="p").update(input_price_per_mtok=Decimal("3"))
    with pricing._sources_lock:  # age the entry past its TTL
        pricing._sources["p"] = (time.monotonic() - pricing.SOURCE_TTL_S - 1, cold)
    stale = async_to_sync(look)()
    assert stale is not None and stale.input_per_mtok == Decimal("1")  # served at once
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with pricing._sources_lock:
            current = pricing._sources["p"][1]
        if current is not None and current.input_per_mtok == Decimal("3"):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the background refresh never landed")
    pricing.forget()
