"""The router's walk as a caller and an operator see it (issue 17, second mutation pass):
what a forced provider that cannot run answers, how skips and failures are announced
and recorded, which chain a request resolves to.

Only public entry points (``route``, ``route_stream``, ``resolve``, ``explain``) and
the rows the recorder writes, so these tests hold across a rewrite of the walk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, ClassVar

import pytest
from django.test import override_settings

from llm_routing.errors import (
    REDACTED,
    NetworkError,
    ProviderTimeoutError,
    RateLimitError,
    UnavailableError,
)
from llm_routing.models import Attempt, Chain, Provider, RoutingDecision, RoutingRule
from llm_routing.providers import registry
from llm_routing.providers.mock import MockProvider
from llm_routing.resilience import breaker
from llm_routing.router import explain, resolve, route, route_stream
from llm_routing.signals import after_provider_result, before_provider_call, request_routed
from llm_routing.types import (
    AuditRequest,
    Principal,
    ProviderConfig,
    ProviderResult,
    StreamChunk,
    StreamDelta,
    StreamEnd,
    StreamEvent,
    StreamFailure,
    StreamResult,
    StreamToolCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)

from .breaker_support import FakeClock
from .conftest import ScriptedProvider, make_chain, make_provider

REQUEST = AuditRequest(task="summarize", input_text="hello")


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def chain(scripted: type[ScriptedProvider], key_env: str) -> type[ScriptedProvider]:
    a = make_provider("a", supports_streaming=True, max_retries=0)
    b = make_provider("b", supports_streaming=True, supports_prefill=True)
    make_chain("main", [a, b], is_default=True)
    make_provider("off", enabled=False)
    make_provider("nokey", api_key_env="LLMR_MUTATION_UNSET_KEY")
    make_provider("nostream", supports_streaming=False)
    return scripted


# --- forced mode: a provider that cannot run answers why, and nothing else runs ----------

FORCED_SKIPS = [
    # (forced name, request changes, expected (mode, status, category, message, model))
    ("off", {}, ("disabled", "fallback", "disabled", "The provider is disabled.", "off-model")),
    (
        "nokey",
        {},
        (
            "disabled",
            "fallback",
            "missing_key",
            "The provider's key variable is not set.",
            "nokey-model",
        ),
    ),
    ("ghost", {}, ("error", "error", "unknown_provider", "No provider has that name.", "")),
    (
        "nostream",
        {"stream": True},
        (
            "error",
            "error",
            "unsupported",
            "The provider does not support streaming, which this request needs.",
            "nostream-model",
        ),
    ),
    (
        "a",
        {"principal": Principal(user_id=1)},
        ("error", "error", "not_allowed", "You may not route to this provider.", "a-model"),
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("forced", "changes", "expected"), FORCED_SKIPS)
def test_a_forced_provider_that_cannot_run_answers_why(
    chain: type[ScriptedProvider],
    forced: str,
    changes: dict[str, object],
    expected: tuple[str, str, str, str, str],
) -> None:
    request = replace(REQUEST, force_provider=forced, **changes)  # type: ignore[arg-type]
    routed = route(request, sleeper=Sleeps())
    mode, status, category, message, model = expected
    result = routed.result
    assert (result.provider, result.model, result.mode, result.status) == (
        forced,
        model,
        mode,
        status,
    )
    assert result.error is not None
    assert (result.error.category, result.error.message) == (category, message)
    assert chain.calls == []  # nothing was sent, and no mock stood in
    assert routed.metadata.router_mode == "forced"
    assert routed.metadata.fallback_used is False
    row = Attempt.objects.get()
    assert (row.provider, row.model, row.outcome, row.reason) == (
        forced,
        model,
        "skipped",
        category,
    )


@pytest.mark.django_db
def test_a_forced_provider_with_an_open_circuit_answers_circuit_open(
    chain: type[ScriptedProvider], clock: FakeClock
) -> None:
    breaker.store.force_open("a", "a-model", 60.0)
    routed = route(replace(REQUEST, force_provider="a"), sleeper=Sleeps())
    assert routed.result.error is not None
    assert (routed.result.mode, routed.result.status) == ("error", "error")
    assert (routed.result.error.category, routed.result.error.message) == (
        "circuit_open",
        "The provider's circuit is open.",
    )
    assert chain.calls == []
    assert Attempt.objects.get().reason == "circuit_open"


@pytest.mark.django_db
@override_settings(LLM_ROUTING={"MAX_ATTEMPTS": 0})
def test_a_forced_provider_without_budget_answers_budget_exhausted(
    chain: type[ScriptedProvider],
) -> None:
    routed = route(replace(REQUEST, force_provider="a"), sleeper=Sleeps())
    assert routed.result.error is not None
    assert (routed.result.mode, routed.result.status) == ("error", "error")
    assert (routed.result.error.category, routed.result.error.message) == (
        "budget_exhausted",
        "The request-wide deadline or attempt budget is used up.",
    )
    assert (routed.result.provider, routed.result.model) == ("a", "a-model")


@pytest.mark.django_db
def test_a_forced_call_that_fails_is_recorded_as_not_served(
    chain: type[ScriptedProvider],
) -> None:
    chain.scripts["a"] = [UnavailableError(http_status=503)]
    routed = route(replace(REQUEST, force_provider="a"), sleeper=Sleeps())
    assert routed.result.error is not None and routed.result.error.category == "unavailable"
    assert [c[0] for c in chain.calls] == ["a"]  # no failover, no mock
    row = Attempt.objects.get()
    assert (row.provider, row.outcome, row.served, row.http_status) == ("a", "error", False, 503)
    assert RoutingDecision.objects.get().selected_provider == "a"


# --- streams: what each chunk and the end event carry -----------------------------------


def stream(request: AuditRequest, mode: str | None = None) -> tuple[list[StreamChunk], Any]:
    events = list(route_stream(replace(request, stream=True), stream_mode=mode, sleeper=Sleeps()))
    chunks = [e for e in events[:-1] if isinstance(e, StreamChunk)]
    assert len(chunks) == len(events) - 1
    return chunks, events[-1]


@pytest.mark.django_db
def test_streamed_tool_call_fragments_reach_the_caller_and_the_result(
    chain: type[ScriptedProvider],
) -> None:
    first = ToolCallDelta(index=0, id="call_1", name="lookup")
    rest = ToolCallDelta(index=0, arguments='{"q": 1}')
    chain.streams["a"] = [
        [
            StreamToolCallDelta(first),
            StreamToolCallDelta(rest),
            StreamEnd(finish_reason="tool_calls"),
        ]
    ]
    chunks, last = stream(REQUEST)
    assert [(c.text, c.provider, c.model, c.tool_call) for c in chunks] == [
        ("", "a", "a-model", first),
        ("", "a", "a-model", rest),
    ]
    assert isinstance(last, StreamResult)
    result = last.routed.result
    # The end event carried no assembled calls: the result assembles the fragments.
    assert result.tool_calls == (ToolCall(id="call_1", name="lookup", arguments='{"q": 1}'),)
    assert result.finish_reason == "tool_calls"


@pytest.mark.django_db
def test_a_streamed_key_never_reaches_the_caller_and_held_text_is_delivered_at_the_end(
    chain: type[ScriptedProvider], key_env: str
) -> None:
    # The key split across two deltas; the stream ends on text that could begin a key
    # (held back by the scrubber until the end, then delivered by the serving provider).
    chain.streams["a"] = [["key ", key_env[:9], key_env[9:] + " done ", key_env[:6], "END"]]
    chunks, last = stream(REQUEST)
    text = "".join(c.text for c in chunks)
    assert key_env not in text
    assert text == f"key {REDACTED} done {key_env[:6]}"
    assert chunks[-1].text == key_env[:6]
    assert (chunks[-1].provider, chunks[-1].model) == ("a", "a-model")
    assert isinstance(last, StreamResult) and last.routed.result.output == text


@pytest.mark.django_db
def test_a_stream_reports_the_model_its_end_event_names(chain: type[ScriptedProvider]) -> None:
    chain.streams["a"] = [["Hi", StreamEnd(finish_reason="stop", model="a-model-2026-01")]]
    _chunks, last = stream(REQUEST)
    assert isinstance(last, StreamResult)
    assert last.routed.result.model == "a-model-2026-01"
    assert last.routed.result.finish_reason == "stop"


@pytest.mark.django_db
def test_a_structured_stream_reports_its_parsed_answer(
    scripted: type[ScriptedProvider], key_env: str
) -> None:
    s = make_provider("s", supports_streaming=True, supports_structured_output=True)
    make_chain("main", [s], is_default=True)
    scripted.streams["s"] = [['{"answer": ', "42}", "END"]]
    request = replace(REQUEST, response_schema={"type": "object"})
    _chunks, last = stream(request)
    assert isinstance(last, StreamResult)
    assert last.routed.result.output == '{"answer": 42}'
    assert last.routed.result.data == {"answer": 42}


@pytest.mark.django_db
def test_a_failed_stream_result_keeps_the_text_that_was_delivered(
    chain: type[ScriptedProvider],
) -> None:
    chain.streams["a"] = [["one ", "two ", NetworkError("reset")]]
    _chunks, last = stream(REQUEST)
    assert isinstance(last, StreamFailure)
    assert last.routed.result.output == "one two "
    assert last.routed.result.status == "error"


@pytest.mark.django_db
def test_a_mid_stream_timeout_inside_the_deadline_is_the_providers_and_counts(
    chain: type[ScriptedProvider], clock: FakeClock
) -> None:
    # The request deadline (5 s) clamps the provider's 30 s timeout, but the deadline is
    # not spent: the timeout is the provider's, recorded and counted on its circuit.
    Provider.objects.filter(name="a").update(timeout_s=30.0)
    chain.streams["a"] = [["one ", ProviderTimeoutError("slow")]]
    with override_settings(LLM_ROUTING={"REQUEST_DEADLINE_S": 5.0}):
        _chunks, last = stream(REQUEST)
    assert isinstance(last, StreamFailure) and last.error.category == "timeout"
    view = breaker.store.load("a", "a-model").health(clock())
    assert (view["last_error_category"], view["consecutive_failures"]) == ("timeout", 1)


@pytest.mark.django_db
def test_a_continued_stream_charges_the_cut_to_the_first_provider_only(
    chain: type[ScriptedProvider], clock: FakeClock
) -> None:
    chain.streams["a"] = [["The quick ", NetworkError("reset")]]
    chain.streams["b"] = [["fox.", "END"]]
    _chunks, last = stream(REQUEST, "continuation")
    assert isinstance(last, StreamResult) and last.routed.result.provider == "b"
    a = breaker.store.load("a", "a-model").health(clock())
    assert (a["last_error_category"], a["consecutive_failures"], a["last_success_at"]) == (
        "network",
        1,
        None,
    )
    b = breaker.store.load("b", "b-model").health(clock())
    assert b["last_success_at"] is not None and b["last_error_at"] is None


@pytest.mark.django_db
def test_continued_chunks_name_the_provider_that_continues(
    scripted: type[ScriptedProvider], key_env: str
) -> None:
    early = make_provider("early", supports_streaming=True, supports_prefill=True)
    a = make_provider("a", supports_streaming=True, max_retries=0)
    odd = make_provider("odd", kind="no_such_kind", supports_streaming=True)
    c = make_provider("c", supports_streaming=True, supports_prefill=True)
    make_chain("main", [early, a, odd, c], is_default=True)
    scripted.streams["early"] = [[UnavailableError(http_status=503)]]
    scripted.streams["a"] = [["Once ", NetworkError("reset")]]
    scripted.streams["c"] = [["upon ", "a time.", "END"]]
    chunks, last = stream(REQUEST, "continuation")
    assert [(c.text, c.provider, c.model) for c in chunks] == [
        ("Once ", "a", "a-model"),
        ("upon ", "c", "c-model"),
        ("a time.", "c", "c-model"),
    ]
    # "odd" (a kind no adapter serves) is passed over, not a crash.
    assert isinstance(last, StreamResult) and last.routed.result.provider == "c"


# --- the mock backstop -------------------------------------------------------------------


@pytest.mark.django_db
def test_a_provider_row_named_mock_configures_the_backstop(
    scripted: type[ScriptedProvider], key_env: str, caplog: pytest.LogCaptureFixture
) -> None:
    a = make_provider("a", max_retries=0)
    make_chain("main", [a], is_default=True)
    make_provider("mock", kind="openai", model="house-mock", enabled=False)
    scripted.scripts["a"] = [UnavailableError(http_status=503)]
    caplog.set_level(logging.ERROR, logger="llm_routing.router")
    routed = route(REQUEST, sleeper=Sleeps())
    result = routed.result
    assert (result.provider, result.model, result.mode, result.status) == (
        "mock",
        "house-mock",
        "mock",
        "ok",
    )
    assert routed.metadata.fallback_reason == "chain_exhausted"
    assert caplog.records == []  # the backstop was built, not patched over


@pytest.mark.django_db
def test_the_default_backstop_answers_with_the_mock_model(chain: type[ScriptedProvider]) -> None:
    chain.scripts["a"] = [UnavailableError(http_status=503)]
    chain.scripts["b"] = [UnavailableError(http_status=503)]
    routed = route(REQUEST, sleeper=Sleeps())
    assert (routed.result.provider, routed.result.model) == ("mock", "mock-1")


# --- the walk: when every candidate is skipped or fails ----------------------------------

NO_BACKSTOP = replace(REQUEST, backstop=False)


@pytest.mark.django_db
def test_a_chain_without_backstop_that_fails_ends_in_chain_exhausted(
    chain: type[ScriptedProvider],
) -> None:
    chain.scripts["a"] = [UnavailableError(http_status=503)]
    chain.scripts["b"] = [UnavailableError(http_status=502)]
    routed = route(NO_BACKSTOP, sleeper=Sleeps())
    result = routed.result
    assert (result.provider, result.model, result.mode, result.status) == (
        "b",
        "b-model",
        "error",
        "error",
    )
    assert result.error is not None
    assert (result.error.category, result.error.transient) == ("chain_exhausted", True)
    assert result.error.message == (
        "Every candidate was skipped or failed, and this chain has no mock backstop."
    )
    assert routed.metadata.fallback_reason == "chain_exhausted"
    assert routed.metadata.chain == ("a", "b")  # no mock was added
    assert {c[0] for c in chain.calls} == {"a", "b"}


@pytest.mark.django_db
def test_a_chain_without_backstop_whose_candidates_are_all_skipped_names_the_last(
    chain: type[ScriptedProvider],
) -> None:
    Provider.objects.filter(name__in=["a", "b"]).update(enabled=False)
    routed = route(NO_BACKSTOP, sleeper=Sleeps())
    assert (routed.result.provider, routed.result.model) == ("b", "b-model")
    assert routed.result.error is not None
    assert routed.result.error.category == "chain_exhausted"
    # a skipped chain member is recorded under its row's model
    assert list(Attempt.objects.order_by("index").values_list("provider", "model", "reason")) == [
        ("a", "a-model", "disabled"),
        ("b", "b-model", "disabled"),
    ]


@pytest.mark.django_db
def test_no_candidate_at_all_without_backstop_is_chain_exhausted_with_no_provider(
    scripted: type[ScriptedProvider],
) -> None:
    routed = route(NO_BACKSTOP, sleeper=Sleeps())
    assert (routed.result.provider, routed.result.model, routed.result.status) == ("", "", "error")
    assert routed.result.error is not None
    assert routed.result.error.category == "chain_exhausted"
    assert routed.metadata.attempts == ()


@pytest.mark.django_db
def test_an_unknown_explicit_provider_is_skipped_with_no_model(
    chain: type[ScriptedProvider],
) -> None:
    routed = route(replace(REQUEST, provider="ghost"), sleeper=Sleeps())
    assert routed.result.provider == "a"
    first = routed.metadata.attempts[0]
    assert (first.provider, first.model, first.reason) == ("ghost", "", "unknown_provider")


@pytest.mark.django_db
def test_the_last_real_candidate_serving_after_a_failure_is_an_ordinary_fallback(
    chain: type[ScriptedProvider],
) -> None:
    chain.scripts["a"] = [UnavailableError(http_status=503)]
    routed = route(NO_BACKSTOP, sleeper=Sleeps())
    assert routed.result.provider == "b" and routed.result.ok
    assert routed.metadata.fallback_reason == "unavailable"  # not chain_exhausted


@pytest.mark.django_db
def test_a_failed_result_without_error_details_fails_over_as_a_response_error(
    chain: type[ScriptedProvider],
) -> None:
    chain.scripts["a"] = [ProviderResult(provider="a", model="", mode="error", status="error")]
    routed = route(REQUEST, sleeper=Sleeps())
    assert routed.result.provider == "b" and routed.result.ok
    assert routed.metadata.fallback_reason == "response"


@pytest.mark.django_db
def test_a_chain_the_caller_may_not_use_is_skipped_as_not_allowed(
    chain: type[ScriptedProvider], user: Any
) -> None:
    from llm_routing.models import Chain

    Chain.objects.get(name="main").allowed_users.add(user)
    stranger = Principal(user_id=user.pk + 1000)
    routed = route(replace(REQUEST, principal=stranger), sleeper=Sleeps())
    assert chain.calls == []
    assert routed.result.provider == "mock"
    assert [(a.provider, a.reason) for a in routed.metadata.attempts] == [
        ("a", "not_allowed"),
        ("b", "not_allowed"),
        ("mock", None),
    ]
    assert routed.metadata.fallback_reason == "not_allowed"


@pytest.mark.django_db
def test_forcing_an_unknown_provider_without_permission_does_not_say_it_is_unknown(
    chain: type[ScriptedProvider],
) -> None:
    routed = route(
        replace(REQUEST, force_provider="ghost", principal=Principal(user_id=1)), sleeper=Sleeps()
    )
    assert routed.result.error is not None
    assert routed.result.error.category == "not_allowed"


@pytest.mark.django_db
def test_forcing_a_disabled_row_of_an_unknown_kind_is_unknown_provider(
    chain: type[ScriptedProvider],
) -> None:
    make_provider("odd", kind="no_such_kind", enabled=False)
    routed = route(replace(REQUEST, force_provider="odd"), sleeper=Sleeps())
    assert routed.result.error is not None
    assert routed.result.error.category == "unknown_provider"


# --- streams: the commit point and the probe slot ----------------------------------------


@pytest.mark.django_db
def test_an_empty_first_delta_is_not_the_commit_point(chain: type[ScriptedProvider]) -> None:
    chain.streams["a"] = [["", NetworkError("reset")]]
    chain.streams["b"] = [["from b", "END"]]
    chunks, last = stream(REQUEST)
    assert isinstance(last, StreamResult) and last.routed.result.provider == "b"
    assert "".join(c.text for c in chunks) == "from b"


@pytest.mark.django_db
def test_a_tool_call_fragment_then_a_cut_is_a_partial_failure(
    chain: type[ScriptedProvider],
) -> None:
    delta = ToolCallDelta(index=0, id="call_1", name="lookup")
    chain.streams["a"] = [[StreamToolCallDelta(delta), NetworkError("reset")]]
    chunks, last = stream(REQUEST)
    assert [c.tool_call for c in chunks] == [delta]
    assert isinstance(last, StreamFailure) and last.partial is True


@pytest.mark.django_db
def test_tool_calls_assembled_by_the_adapter_are_the_results(
    chain: type[ScriptedProvider],
) -> None:
    call = ToolCall(id="call_9", name="lookup", arguments='{"q": 2}')
    chain.streams["a"] = [["ok", StreamEnd(finish_reason="tool_calls", tool_calls=(call,))]]
    _chunks, last = stream(REQUEST)
    assert isinstance(last, StreamResult) and last.routed.result.tool_calls == (call,)


@pytest.mark.django_db
def test_a_client_leaving_a_probe_stream_frees_the_probe_slot(
    chain: type[ScriptedProvider], clock: FakeClock
) -> None:
    breaker.store.force_open("a", "a-model", 1.0)
    clock.advance(1.0)  # half-open: the next call is the single probe
    chain.streams["a"] = [["one ", "two ", "END"]]
    events: Any = route_stream(replace(REQUEST, stream=True), sleeper=Sleeps())  # a generator
    first = next(events)
    assert isinstance(first, StreamChunk) and first.provider == "a"
    events.close()  # the client went away
    config = ProviderConfig(name="a", kind="scripted", model="a-model", timeout_s=30.0)
    assert breaker.allow(config)  # the slot is free for the next probe


# --- the output ceiling each candidate sends ---------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("params", "setting", "asked", "sent"),
    [
        ({"max_tokens": 100}, None, 500, 100),  # the row's ceiling
        ({"max_completion_tokens": 80, "max_tokens": 100}, None, 500, 80),  # the lower one
        ({"max_tokens": 100}, None, 50, 50),  # below the ceiling: as asked
        ({"max_tokens": 100}, None, None, None),  # the row's own value stays the adapter's
        ({"max_tokens": 100}, 60, None, 60),  # the row's value above the setting: clamped
        ({}, 60, 500, 60),  # the setting alone
        ({"max_tokens": True}, None, 500, 500),  # not a number of tokens: no ceiling
        ({"max_tokens": 0}, None, 500, 500),
        ({"max_tokens": 1}, None, 500, 1),
    ],
)
def test_each_candidate_sends_at_most_its_output_ceiling(
    chain: type[ScriptedProvider],
    params: dict[str, object],
    setting: int | None,
    asked: int | None,
    sent: int | None,
) -> None:
    Provider.objects.filter(name="a").update(params=params)
    with override_settings(LLM_ROUTING={"MAX_OUTPUT_TOKENS": setting}):
        route(replace(REQUEST, max_tokens=asked), sleeper=Sleeps())
    assert [(name, r.max_tokens) for name, r in chain.requests] == [("a", sent)]


@pytest.mark.django_db
def test_a_structured_stream_that_breaks_its_schema_has_no_parsed_answer(
    scripted: type[ScriptedProvider], key_env: str
) -> None:
    s = make_provider("s", supports_streaming=True, supports_structured_output=True)
    make_chain("main", [s], is_default=True)
    scripted.streams["s"] = [['{"answer": ', '"forty-two"}', "END"]]
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    _chunks, last = stream(replace(REQUEST, response_schema=schema))
    assert isinstance(last, StreamResult)
    assert last.routed.result.output == '{"answer": "forty-two"}'
    assert last.routed.result.data is None


@pytest.mark.django_db
def test_forcing_an_unknown_provider_for_a_stream_is_unknown_provider(
    chain: type[ScriptedProvider],
) -> None:
    _chunks, last = stream(replace(REQUEST, force_provider="ghost"))
    assert isinstance(last, StreamResult)
    assert last.routed.result.error is not None
    assert last.routed.result.error.category == "unknown_provider"


class TimedProvider(ScriptedProvider):
    """Records the timeout each stream is opened with."""

    kind: ClassVar[str] = "scripted_timed"
    timeouts: ClassVar[list[float | None]] = []

    def stream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> Iterator[StreamEvent]:
        type(self).timeouts.append(timeout)
        return super().stream(request, api_key=api_key, timeout=timeout)


@pytest.mark.django_db
def test_a_stream_is_opened_with_the_providers_timeout(
    scripted: type[ScriptedProvider], key_env: str
) -> None:
    registry.register("scripted_timed", TimedProvider)
    TimedProvider.timeouts = []
    t = make_provider("t", kind="scripted_timed", supports_streaming=True, timeout_s=7.0)
    make_chain("main", [t], is_default=True)
    _chunks, last = stream(REQUEST)
    assert isinstance(last, StreamResult) and last.routed.result.provider == "t"
    assert TimedProvider.timeouts == [7.0]


# --- explain: what route would do, per candidate ------------------------------------------


@pytest.mark.django_db
def test_explain_lists_every_candidate_with_its_model_and_no_probe(
    chain: type[ScriptedProvider],
) -> None:
    make_provider("odd", kind="no_such_kind", enabled=False)
    seen = explain(replace(REQUEST, provider="ghost"))
    rows = [
        (c.position, c.provider, c.model, c.verdict, c.reason, c.probe, c.backstop)
        for c in seen.candidates
    ]
    assert rows == [
        (0, "ghost", "", "skip", "unknown_provider", False, False),
        (1, "a", "a-model", "try", None, False, False),
        (2, "b", "b-model", "try", None, False, False),
        (3, "mock", "mock-1", "try", None, False, True),
    ]


@pytest.mark.django_db
def test_explain_without_backstop_marks_no_candidate_as_the_backstop(
    chain: type[ScriptedProvider],
) -> None:
    seen = explain(NO_BACKSTOP)
    assert [(c.provider, c.backstop) for c in seen.candidates] == [("a", False), ("b", False)]


@pytest.mark.django_db
def test_explain_names_a_missing_capability_only_for_an_unsupported_skip(
    chain: type[ScriptedProvider],
) -> None:
    # "off" lacks streaming too, but it is skipped as disabled first
    make_provider("off2", enabled=False, supports_streaming=False)
    seen = explain(replace(REQUEST, provider="off2", stream=True))
    first = seen.candidates[0]
    assert (first.provider, first.reason, first.missing_capability) == ("off2", "disabled", None)


@pytest.mark.django_db
def test_explain_of_a_row_no_adapter_serves(chain: type[ScriptedProvider]) -> None:
    make_provider("odd", kind="no_such_kind", enabled=False, model="odd-model")
    chained = explain(replace(REQUEST, provider="odd"))
    first = chained.candidates[0]
    assert (first.position, first.provider, first.model, first.verdict, first.reason) == (
        0,
        "odd",
        "odd-model",
        "skip",
        "disabled",
    )
    forced = explain(replace(REQUEST, force_provider="odd")).candidates[0]
    assert (forced.model, forced.verdict, forced.reason) == (
        "odd-model",
        "skip",
        "unknown_provider",
    )


class FailingMock(MockProvider):
    """A "mock" kind override (``PROVIDER_KINDS``) that cannot answer."""

    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        raise UnavailableError("the house mock is down", http_status=503)


@pytest.mark.django_db
def test_a_backstop_that_fails_too_ends_the_walk_with_a_response_error(
    chain: type[ScriptedProvider],
) -> None:
    chain.scripts["a"] = [UnavailableError(http_status=503)]
    chain.scripts["b"] = [UnavailableError(http_status=503)]
    kinds = {"PROVIDER_KINDS": {"mock": f"{__name__}.FailingMock"}}
    with override_settings(LLM_ROUTING=kinds):
        registry.clear_adapter_cache()
        routed = route(REQUEST, sleeper=Sleeps())
    registry.clear_adapter_cache()
    result = routed.result
    assert (result.provider, result.model, result.status) == ("mock", "mock-1", "error")
    assert result.error is not None
    assert (result.error.category, result.error.message) == (
        "response",
        "Every candidate failed, the mock backstop included.",
    )
    assert routed.metadata.fallback_reason == "chain_exhausted"
    assert [a.provider for a in routed.metadata.attempts] == ["a", "b", "mock"]


# --- resolve: which chain, which mode, which backstop ------------------------------------


@pytest.mark.django_db
def test_a_plan_without_any_chain_names_none(scripted: type[ScriptedProvider]) -> None:
    plan = resolve(REQUEST)
    assert (plan.chain_name, plan.rule, plan.stream_mode, plan.backstop) == (
        None,
        None,
        "direct",
        True,
    )
    assert resolve(NO_BACKSTOP).backstop is False


@pytest.mark.django_db
def test_settings_chains_route_under_each_providers_own_model(
    chain: type[ScriptedProvider],
) -> None:
    Chain.objects.all().delete()
    settings = {"DEFAULT_CHAIN": ["b"], "ROUTES": {"gold": ["a"]}}
    with override_settings(LLM_ROUTING=settings):
        plan = resolve(replace(REQUEST, route="gold"))
        assert (plan.chain_name, plan.stream_mode, plan.names) == (
            "route:gold",
            "direct",
            ("a", "mock"),
        )
        by_route = route(replace(REQUEST, route="gold"), sleeper=Sleeps())
        by_default = route(REQUEST, sleeper=Sleeps())
    assert (by_route.result.provider, by_route.result.model) == ("a", "a-model")
    assert by_route.metadata.route == "gold"
    assert (by_default.result.provider, by_default.result.model) == ("b", "b-model")
    assert by_default.metadata.chain_name == "settings"


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["named", "rule", "default"])
def test_a_chains_own_backstop_and_stream_mode_apply_however_it_was_chosen(
    scripted: type[ScriptedProvider], key_env: str, how: str
) -> None:
    a = make_provider("a")
    chosen = make_chain("alt", [a], is_default=how == "default")
    Chain.objects.filter(pk=chosen.pk).update(mock_backstop=True, stream_mode="atomic")
    if how == "rule":
        RoutingRule.objects.create(name="r", route="gold", chain=chosen)
    request = replace(NO_BACKSTOP, chain="alt" if how == "named" else None, route="gold")
    plan = resolve(request)
    assert (plan.chain_name, plan.backstop, plan.stream_mode) == ("alt", True, "atomic")
    assert plan.names == ("a", "mock")


@pytest.mark.django_db
def test_a_forced_plan_names_the_forced_provider_as_requested(
    chain: type[ScriptedProvider],
) -> None:
    routed = route(replace(REQUEST, force_provider="b"), sleeper=Sleeps())
    assert routed.metadata.requested_provider == "b"
    seen = explain(replace(REQUEST, force_provider="b"))
    assert [(c.provider, c.model) for c in seen.candidates] == [("b", "b-model")]


@pytest.mark.django_db
def test_asking_for_the_mock_is_explicit_and_answers_with_the_mock_model(
    chain: type[ScriptedProvider],
) -> None:
    routed = route(replace(REQUEST, provider="mock"), sleeper=Sleeps())
    assert routed.metadata.router_mode == "explicit"
    assert routed.metadata.chain == ("mock",)
    assert (routed.result.provider, routed.result.model) == ("mock", "mock-1")


@pytest.mark.django_db
def test_an_explicit_provider_outside_the_callers_chains_is_not_allowed(
    chain: type[ScriptedProvider],
) -> None:
    make_provider("c")  # in no chain
    routed = route(replace(REQUEST, provider="c", principal=Principal(user_id=1)), sleeper=Sleeps())
    first = routed.metadata.attempts[0]
    assert (first.provider, first.reason) == ("c", "not_allowed")
    assert routed.result.provider == "a"


@pytest.mark.django_db
def test_a_mock_mode_row_of_any_kind_is_served_by_the_mock_and_an_unknown_kind_is_skipped(
    chain: type[ScriptedProvider], caplog: pytest.LogCaptureFixture
) -> None:
    make_provider("offline", kind="no_such_kind", mode="mock")
    make_provider("odd", kind="no_such_kind")
    caplog.set_level(logging.ERROR, logger="llm_routing.router")
    served = route(replace(REQUEST, provider="offline"), sleeper=Sleeps())
    assert (served.result.provider, served.result.mode) == ("offline", "mock")
    skipped = route(replace(REQUEST, provider="odd"), sleeper=Sleeps())
    assert skipped.metadata.attempts[0].reason == "unknown_provider"
    assert caplog.records == []  # an unknown kind is a skip, not an adapter error


@pytest.mark.django_db
def test_an_adapter_that_cannot_be_built_is_skipped_and_logged(
    chain: type[ScriptedProvider], caplog: pytest.LogCaptureFixture
) -> None:
    make_provider("broken", kind="broken_kind")
    caplog.set_level(logging.ERROR, logger="llm_routing.router")
    with override_settings(LLM_ROUTING={"PROVIDER_KINDS": {"broken_kind": "no.such.Adapter"}}):
        routed = route(replace(REQUEST, provider="broken"), sleeper=Sleeps())
    assert routed.metadata.attempts[0].reason == "unknown_provider"
    assert routed.result.provider == "a"
    assert [r.getMessage() for r in caplog.records] == ["Cannot build adapter for provider broken"]


# --- finish: what the routed result and the log line report --------------------------------


@pytest.mark.django_db
def test_the_routed_result_reports_its_request_route_and_total_latency(
    chain: type[ScriptedProvider], caplog: pytest.LogCaptureFixture
) -> None:
    Provider.objects.filter(name="a").update(max_retries=1)
    chain.scripts["a"] = [RateLimitError(http_status=429, retry_after=0.2), "ok"]
    caplog.set_level(logging.INFO, logger="llm_routing.router")
    before = time.perf_counter()
    routed = route(replace(REQUEST, route="gold"), request_id="req-1", sleeper=time.sleep)
    elapsed_ms = (time.perf_counter() - before) * 1000
    assert routed.request_id == routed.metadata.request_id == "req-1"
    assert routed.metadata.route == "gold"
    # It includes the real 0.2 s wait and no more than the call took.
    assert 200.0 <= routed.total_latency_ms <= elapsed_ms
    assert [r.getMessage() for r in caplog.records if r.name == "llm_routing.router"] == [
        "routed request_id=req-1 task=summarize mode=default selected=a status=ok fallback=None"
    ]


@pytest.mark.django_db
def test_a_fallback_is_named_in_the_routed_log_line(
    chain: type[ScriptedProvider], caplog: pytest.LogCaptureFixture
) -> None:
    chain.scripts["a"] = [UnavailableError(http_status=503)]
    caplog.set_level(logging.INFO, logger="llm_routing.router")
    route(REQUEST, request_id="req-2", sleeper=Sleeps())
    assert [r.getMessage() for r in caplog.records if r.name == "llm_routing.router"] == [
        "routed request_id=req-2 task=summarize mode=default selected=b status=ok "
        "fallback=unavailable"
    ]


@pytest.mark.django_db
def test_every_call_is_announced_before_and_after_with_its_arguments(
    chain: type[ScriptedProvider],
) -> None:
    chain.scripts["a"] = [UnavailableError(http_status=503)]
    heard: list[tuple[str, dict[str, Any]]] = []

    def before(sender: Any, **kw: Any) -> None:
        heard.append(("before", {k: v for k, v in kw.items() if k != "signal"}))

    def after(sender: Any, **kw: Any) -> None:
        result = kw["result"]
        heard.append(
            ("after", {"request_id": kw["request_id"], "provider": kw["provider"], "ok": result.ok})
        )

    before_provider_call.connect(before)
    after_provider_result.connect(after)
    try:
        route(replace(REQUEST, task="translate"), request_id="rid-s", sleeper=Sleeps())
    finally:
        before_provider_call.disconnect(before)
        after_provider_result.disconnect(after)
    call_a = {"request_id": "rid-s", "provider": "a", "model": "a-model", "task": "translate"}
    call_b = {"request_id": "rid-s", "provider": "b", "model": "b-model", "task": "translate"}
    assert heard == [
        ("before", call_a),
        ("after", {"request_id": "rid-s", "provider": "a", "ok": False}),
        ("before", call_b),
        ("after", {"request_id": "rid-s", "provider": "b", "ok": True}),
    ]


@pytest.mark.django_db
def test_explain_never_says_unknown_to_a_caller_who_may_not_force(
    chain: type[ScriptedProvider],
) -> None:
    seen = explain(replace(REQUEST, force_provider="ghost", principal=Principal(user_id=1)))
    assert [(c.provider, c.verdict, c.reason) for c in seen.candidates] == [
        ("ghost", "skip", "not_allowed")
    ]


# --- a walk that raises where nothing should: still one exit, as an error -----------------


@pytest.mark.django_db
def test_a_walk_that_raises_ends_as_an_error_named_after_the_last_attempt(
    chain: type[ScriptedProvider], caplog: pytest.LogCaptureFixture
) -> None:
    """An adapter bug past the retry layer (here: a result whose tool call is no
    ToolCall, which the key filter cannot read): the request still ends through the one
    exit, as an error result naming the last attempted provider, recorded and logged
    with its traceback — never an exception to the caller."""
    chain.scripts["a"] = [UnavailableError(http_status=503)]
    broken = ProviderResult(
        provider="b", model="b-model", mode="live", status="ok", tool_calls=("not a call",)
    )  # type: ignore[arg-type]
    chain.scripts["b"] = [broken]
    caplog.set_level(logging.ERROR, logger="llm_routing.router")
    request_id = "0f1e2d3c-4b5a-4978-8796-a5b4c3d2e1f0"
    routed = route(REQUEST, request_id=request_id, sleeper=Sleeps())
    result = routed.result
    assert (result.provider, result.model, result.mode, result.status) == (
        "a",
        "a-model",
        "error",
        "error",
    )
    assert result.error is not None and result.error.category == "response"
    assert result.error.message == "The router failed unexpectedly (AttributeError)."
    [record] = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert record.getMessage() == (
        f"Routing request {request_id} failed unexpectedly (AttributeError); recorded as an error."
    )
    assert record.exc_info is not None and record.exc_info[0] is AttributeError
    decision = RoutingDecision.objects.get()
    assert (str(decision.request_id), decision.selected_provider) == (request_id, "a")
    assert decision.status == "error"


@pytest.mark.django_db
def test_a_walk_that_raises_before_any_attempt_names_no_provider(
    chain: type[ScriptedProvider],
) -> None:
    broken = ProviderResult(
        provider="a", model="a-model", mode="live", status="ok", tool_calls=("not a call",)
    )  # type: ignore[arg-type]
    chain.scripts["a"] = [broken]
    result = route(REQUEST, sleeper=Sleeps()).result
    assert (result.provider, result.model, result.status) == ("", "", "error")
    assert result.error is not None
    assert result.error.message == "The router failed unexpectedly (AttributeError)."


# --- a stream's end: what is held back, and the usage of a stream cut after its end ------


@pytest.mark.django_db
def test_held_tool_call_arguments_are_delivered_at_the_end_and_assembled(
    chain: type[ScriptedProvider], key_env: str
) -> None:
    """Arguments that end on text that could begin a key are held back until the end,
    then delivered as the call's last fragment and assembled into the result."""
    first = ToolCallDelta(index=0, id="call_1", name="lookup", arguments='{"q": "')
    tail = ToolCallDelta(index=0, arguments=key_env[:6])
    chain.streams["a"] = [[StreamToolCallDelta(first), StreamToolCallDelta(tail), "END"]]
    chunks, last = stream(REQUEST)
    fragments = [c.tool_call for c in chunks if c.tool_call is not None]
    assert fragments[-1] == ToolCallDelta(index=0, arguments=key_env[:6])
    assert (chunks[-1].provider, chunks[-1].model) == ("a", "a-model")
    assert isinstance(last, StreamResult)
    [call] = last.routed.result.tool_calls
    assert (call.id, call.name, call.arguments) == ("call_1", "lookup", '{"q": "' + key_env[:6])


@pytest.mark.django_db
def test_a_client_leaving_after_the_end_event_is_charged_the_reported_usage(
    chain: type[ScriptedProvider], key_env: str
) -> None:
    """The upstream finished and reported its usage; the client left while the held
    tail was being delivered: the attempt still carries that usage (it is charged)."""
    usage = Usage(input_tokens=7, output_tokens=5)
    chain.streams["a"] = [["answer ", key_env[:6], StreamEnd(finish_reason="stop", usage=usage)]]
    routed: list[Any] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        routed.append(kwargs["routed"])

    request_routed.connect(receiver)
    try:
        events: Any = route_stream(replace(REQUEST, stream=True), sleeper=Sleeps())
        assert next(events).text == "answer "
        held = next(events)  # delivered once the end event was read
        assert held.text == key_env[:6]
        events.close()  # the client went away
    finally:
        request_routed.disconnect(receiver)
    [decision] = routed
    attempt = decision.metadata.attempts[-1]
    assert (attempt.provider, attempt.usage) == ("a", usage)
    assert decision.result.status == "error"


@pytest.mark.django_db
def test_explain_reads_the_circuit_of_a_chain_entrys_model_override(
    scripted: type[ScriptedProvider], key_env: str, clock: FakeClock
) -> None:
    """A chain entry that overrides the model is its own circuit: explain reads that
    one (open here), not the row model's (closed)."""
    from llm_routing.models import ChainEntry

    a = make_provider("a")
    chain = Chain.objects.create(name="main", is_default=True)
    ChainEntry.objects.create(chain=chain, provider=a, position=0, model="a-large")
    breaker.store.force_open("a", "a-large", 30.0)
    [first, *_rest] = explain(REQUEST).candidates
    assert (first.provider, first.model, first.verdict, first.reason, first.circuit) == (
        "a",
        "a-large",
        "skip",
        "circuit_open",
        "open",
    )


@pytest.mark.django_db
def test_a_cut_stream_with_only_the_backstop_left_keeps_its_own_failure(
    scripted: type[ScriptedProvider], key_env: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Continuation mode, the served provider cut mid-stream and only the mock left:
    the mock cannot continue (no prefill), so the caller gets the original failure —
    an ordinary outcome, not logged as the router failing."""
    caplog.set_level(logging.INFO, logger="llm_routing.router")
    a = make_provider("a", supports_streaming=True, max_retries=0)
    make_chain("main", [a], is_default=True)
    scripted.streams["a"] = [["Once ", NetworkError("reset")]]
    chunks, last = stream(REQUEST, "continuation")
    assert [c.text for c in chunks] == ["Once "]
    assert isinstance(last, StreamFailure) and last.partial is True
    assert last.error.category == "network"
    assert [c[0] for c in scripted.calls] == ["a"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


class EventfulProvider(ScriptedProvider):
    """Streams text around an event the router does not know (a keep-alive, say),
    then its end; notes when the router closes its stream."""

    kind: ClassVar[str] = "scripted_eventful"
    closed: ClassVar[list[str]] = []

    def stream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> Iterator[StreamEvent]:
        try:
            yield StreamDelta("Once ")
            yield object()  # type: ignore[misc]
            yield StreamDelta("upon a time.")
            yield StreamEnd(finish_reason="stop")
            yield StreamDelta(" (past the end)")
        finally:
            type(self).closed.append(self.config.name)


@pytest.mark.django_db
def test_a_stream_skips_events_it_does_not_know_and_is_closed_at_its_end(
    scripted: type[ScriptedProvider], key_env: str
) -> None:
    registry.register(EventfulProvider.kind, EventfulProvider)
    EventfulProvider.closed = []
    a = make_provider("a", kind=EventfulProvider.kind, supports_streaming=True)
    make_chain("main", [a], is_default=True)
    events: Any = route_stream(replace(REQUEST, stream=True), sleeper=Sleeps())
    chunks = []
    for event in events:
        if not isinstance(event, StreamChunk):
            final = event
            assert EventfulProvider.closed == ["a"]  # closed before the final event
            break
        chunks.append(event.text)
    assert chunks == ["Once ", "upon a time."]
    assert isinstance(final, StreamResult)
    assert final.routed.result.output == "Once upon a time."


class HeldTailProvider(ScriptedProvider):
    """Streams text ending in what could begin a key (the key filter holds it back
    until the stream ends), then its end; notes when the router closes its stream."""

    kind: ClassVar[str] = "scripted_held_tail"
    closed: ClassVar[list[str]] = []

    def stream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> Iterator[StreamEvent]:
        try:
            yield StreamDelta("Once upon a time, sk-")
            yield StreamEnd(finish_reason="stop")
            yield StreamDelta(" (past the end)")
        finally:
            type(self).closed.append(self.config.name)


@pytest.mark.django_db
def test_a_stream_is_closed_when_its_end_is_read_before_the_held_tail_is_handed_over(
    scripted: type[ScriptedProvider], key_env: str
) -> None:
    """The upstream stream is closed as soon as its end is read, before the text the
    key filter held back is handed to the caller: a caller slow to read the tail holds
    no upstream connection, and nothing is left for a finalizer to close."""
    registry.register(HeldTailProvider.kind, HeldTailProvider)
    HeldTailProvider.closed = []
    a = make_provider("a", kind=HeldTailProvider.kind, supports_streaming=True)
    make_chain("main", [a], is_default=True)
    seen: list[tuple[str, list[str]]] = []
    final: Any = None
    for event in route_stream(replace(REQUEST, stream=True), sleeper=Sleeps()):
        if not isinstance(event, StreamChunk):
            final = event
            break
        seen.append((event.text, list(HeldTailProvider.closed)))
    assert seen == [("Once upon a time, ", []), ("sk-", ["a"])]
    assert isinstance(final, StreamResult)
    assert final.routed.result.output == "Once upon a time, sk-"
