"""Issue 22, the core's part: one exit and one key filter (docs/testing.md, "Issue 22: core").

Finding 1: a request that reaches the walk ends through ONE exit (``routing.walk._Session.finish``)
that records the decision (or hands it to the write-behind queue), sends ``request_routed``
(which settles the budget, releases the place in flight and counts the metrics) — exactly
once, whatever raised before it. The finding's own trigger is a lone surrogate in a
message's ``name``: ``input_sha256`` raised inside the recorder after the upstream had been
called (and billed), so no row, no charge, a 500 (non-stream) or a stream without its
``result`` event. The HTTP tests below take the same path with the recorder itself raising
(what the surrogate did), so they hold whatever the input boundary decides about surrogates;
the router-level tests send the surrogate itself.

Finding 6b: a sync stream iterator dropped without ``close()`` is finalized by the garbage
collector; its record goes to the write-behind queue, never to the database from the
finalizer.

Finding 2: a key echoed by the upstream in streamed tool-call arguments (split across
fragments) never leaves, on ``/v1`` and ``/audit/`` streams, sync and async.

Real HTTP to the fake upstream (tests/fakes/upstream.py) throughout.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rest_framework.authtoken.models import Token

from llm_routing import budgets, effects, recorder, router
from llm_routing.asgi import get_asgi_application
from llm_routing.models import Budget, RoutingDecision
from llm_routing.sanitize import TRIGGER_CHARS, KeyGuard
from llm_routing.signals import request_routed
from llm_routing.types import (
    AuditRequest,
    ErrorInfo,
    Message,
    StreamChunk,
    StreamFailure,
    StreamResult,
    Tool,
)
from tests.fakes.upstream import FakeUpstream, Fault, Faults, JSONText

KEY = "sk-issue22-core-0123456789abcdef"
SURROGATE = "\ud800"
MESSAGES = [{"role": "user", "content": "hi", "name": "bob"}]
CHAT = {"model": "default", "messages": MESSAGES}
AUDIT = {"task": "summarize", "input_text": "Django is a web framework."}
# The fake upstream's OpenAI answer reports 11 prompt + 7 completion tokens; its stream
# of "one two three" 11 + 3 (a completion token per chunk).
REPORTED = 18
STREAM_REPORTED = 14


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", KEY)


@pytest.fixture
def openai_chain(fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]) -> Any:
    return upstream_chain(
        ("oa", "openai", {"supports_streaming": True, "max_retries": 0}),
    )[0]


@pytest.fixture
def routed_signals() -> Iterator[list[str]]:
    seen: list[str] = []

    def receiver(sender: Any, request_id: str, **kwargs: Any) -> None:
        seen.append(request_id)

    request_routed.connect(receiver, dispatch_uid="test_issue22_core")
    try:
        yield seen
    finally:
        request_routed.disconnect(dispatch_uid="test_issue22_core")


def surrogate_request(*, stream: bool = False) -> AuditRequest:
    """The finding's conversation: a lone surrogate in the message's ``name`` (built
    directly: the router's contract holds for whatever reaches it)."""
    return AuditRequest(
        task="chat",
        messages=(Message(role="user", content="hi", name=SURROGATE),),
        stream=stream,
    )


def sse_events(body: bytes) -> list[tuple[str, Any]]:
    events = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        name, data = "message", ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data += line[len("data: ") :]
        events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


def tokens_used(name: str) -> int:
    budget = Budget.objects.get(name=name)
    return budgets.usage([budget])[name].tokens


# --- finding 1: the surrogate itself, through both drivers ---------------------------------


def test_input_sha256_is_defined_for_a_lone_surrogate() -> None:
    request = surrogate_request()
    assert len(request.input_sha256) == 64
    assert request.input_sha256 != AuditRequest(task="chat", messages=(
        Message(role="user", content="hi", name="\udc00"),)).input_sha256  # fmt: skip


@pytest.mark.django_db
@pytest.mark.usefixtures("driver")
def test_a_surrogate_name_is_recorded_and_announced_non_stream(routed_signals: list[str]) -> None:
    """Served by the shipped mock (an HTTP adapter's JSON encoder refuses the surrogate
    itself: that is the input boundary's concern, not the exit's)."""
    routed = router.route(surrogate_request())
    assert routed.result.status == "ok" and routed.result.provider == "mock"
    assert routed_signals == [routed.request_id]  # request_routed: settlement, metrics
    row = RoutingDecision.objects.get(request_id=routed.request_id)
    assert row.status == "ok" and len(row.input_sha256) == 64


@pytest.mark.django_db
@pytest.mark.usefixtures("driver")
def test_a_surrogate_name_stream_ends_with_its_result_and_is_recorded(
    routed_signals: list[str],
) -> None:
    events = list(router.route_stream(surrogate_request(stream=True)))
    assert isinstance(events[-1], StreamResult), events[-1]
    routed = events[-1].routed
    assert routed.result.status == "ok" and routed.result.output
    assert routed_signals == [routed.request_id]
    assert RoutingDecision.objects.filter(request_id=routed.request_id).count() == 1


# --- finding 1 over HTTP: the recorder raising never loses the answer or the charge --------


@pytest.fixture
def recorder_raises(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``decision_rows`` raising, as it did on the surrogate (the hash raised inside it)."""
    calls: list[str] = []

    def broken(request: AuditRequest, routed: Any) -> Any:
        calls.append(routed.request_id)
        raise UnicodeEncodeError("utf-8", SURROGATE, 0, 1, "surrogates not allowed")

    monkeypatch.setattr(recorder, "decision_rows", broken)
    return calls


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/v1/chat/completions", "/audit/"])
def test_a_recorder_failure_still_answers_and_charges_non_stream(
    api: Any, openai_chain: Any, fake_upstream: FakeUpstream, recorder_raises: list[str], url: str
) -> None:
    Budget.objects.create(name="tok", scope="user", subject="alice", max_tokens=12_000,
                          window="hour")  # fmt: skip
    body = CHAT if url.startswith("/v1") else AUDIT
    answer = api.post(url, data=json.dumps(body), content_type="application/json")
    assert answer.status_code == 200, answer.content
    assert len(recorder_raises) == 1  # the exit tried to record it
    assert tokens_used("tok") == REPORTED  # and charged what the upstream reported


@pytest.mark.django_db
def test_a_recorder_failure_still_ends_the_audit_stream_with_result_and_charges(
    api: Any, openai_chain: Any, fake_upstream: FakeUpstream, recorder_raises: list[str]
) -> None:
    Budget.objects.create(name="tok", scope="user", subject="alice", max_tokens=12_000,
                          window="hour")  # fmt: skip
    fake_upstream.script("openai", Faults.stream(text="one two three"))
    answer = api.post(
        "/audit/", data=json.dumps({**AUDIT, "stream": True}), content_type="application/json"
    )
    assert answer.status_code == 200
    events = sse_events(b"".join(answer.streaming_content))
    answer.close()
    assert events[-1][0] == "result", events[-1]
    assert events[-1][1]["result"]["output"] == "one two three"
    assert len(recorder_raises) == 1
    assert tokens_used("tok") == STREAM_REPORTED


@pytest.mark.django_db
def test_a_recorder_failure_still_ends_the_v1_stream_and_charges(
    api: Any, openai_chain: Any, fake_upstream: FakeUpstream, recorder_raises: list[str]
) -> None:
    Budget.objects.create(name="tok", scope="user", subject="alice", max_tokens=12_000,
                          window="hour")  # fmt: skip
    fake_upstream.script("openai", Faults.stream(text="one two three"))
    answer = api.post(
        "/v1/chat/completions",
        data=json.dumps({**CHAT, "stream": True}),
        content_type="application/json",
    )
    assert answer.status_code == 200
    events = sse_events(b"".join(answer.streaming_content))
    answer.close()
    assert events[-1] == ("message", "[DONE]")
    assert len(recorder_raises) == 1
    assert tokens_used("tok") == STREAM_REPORTED


@pytest.mark.django_db
def test_a_surrogate_name_over_http_is_never_a_500_and_a_served_one_is_charged(
    api: Any, openai_chain: Any, fake_upstream: FakeUpstream
) -> None:
    """The finding as the attacker sent it: never a 500. The input boundary may refuse
    the surrogate (a 400 naming the field, the upstream never called); any other answer
    reached the walk, so it is recorded (and a served one is charged)."""
    Budget.objects.create(name="tok", scope="user", subject="alice", max_tokens=12_000,
                          window="hour")  # fmt: skip
    api.raise_request_exception = False
    body = {"model": "default", "messages": [{"role": "user", "content": "hi",
                                              "name": SURROGATE}]}  # fmt: skip
    answer = api.post("/v1/chat/completions", data=json.dumps(body),
                      content_type="application/json")  # fmt: skip
    assert answer.status_code != 500, answer.content
    if answer.status_code == 400:
        assert not fake_upstream.requests_for("openai")
        return
    assert RoutingDecision.objects.count() == 1
    if answer.status_code == 200:
        assert tokens_used("tok") == REPORTED


# --- finding 1 under ASGI: the place in flight is released -------------------------------


def asgi_settled(token: str, *calls: tuple[str, dict[str, Any]]) -> list[httpx.Response]:
    """POST each (url, body) in turn to the project's ASGI application on one loop,
    waiting after each for its budget settlement (a task on the loop) to be done."""
    app = get_asgi_application()

    async def send_all() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        headers = {"Authorization": f"Token {token}"}
        out = []
        async with httpx.AsyncClient(
            transport=transport, base_url="http://testserver", headers=headers, timeout=30
        ) as client:
            for url, body in calls:
                out.append(await client.post(url, json=body))
                loop = asyncio.get_running_loop()
                await asyncio.gather(*[t for t in budgets._settling if t.get_loop() is loop])
        return out

    return asyncio.run(send_all())


@pytest.mark.django_db(transaction=True)
def test_asgi_a_recorder_failure_charges_and_releases_the_place_in_flight(
    user: Any, openai_chain: Any, fake_upstream: FakeUpstream, recorder_raises: list[str]
) -> None:
    """The finding's ASGI half: one such request against a global tokens budget held its
    place in flight until the lease ran out, and every next request got 429."""
    budget = Budget.objects.create(name="global", scope="global", max_tokens=12_000,
                                   window="hour")  # fmt: skip
    token = str(Token.objects.create(user=user).key)
    fake_upstream.script("openai", Faults.ok(), Faults.stream(text="one two three"), Faults.ok())
    first, streamed, after = asgi_settled(
        token,
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/audit/", AUDIT),
    )
    assert first.status_code == 200, first.text
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("[DONE]")
    assert after.status_code == 200, after.text  # not 429 budget_in_flight
    assert len(recorder_raises) == 3
    assert budgets.usage([budget])["global"].tokens == REPORTED + STREAM_REPORTED + REPORTED


# --- finding 6b: a dropped sync stream never writes from a finalizer ------------------------


@pytest.mark.django_db
def test_a_dropped_sync_stream_hands_its_record_to_write_behind(
    openai_chain: Any,
    fake_upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
    routed_signals: list[str],
) -> None:
    written: list[str] = []
    queued: list[str] = []
    monkeypatch.setattr(
        recorder, "record_or_spool", lambda request, routed: written.append(routed.request_id)
    )
    monkeypatch.setattr(
        recorder, "submit", lambda request, routed: queued.append(routed.request_id)
    )
    fake_upstream.script("openai", Faults.stream(text="one two three four"))
    events = router.route_stream(
        AuditRequest(task="chat", messages=(Message(role="user", content="hi"),), stream=True)
    )
    first = next(events)
    assert not isinstance(first, StreamResult | StreamFailure)
    del events  # dropped without close(): the garbage collector finalizes it
    gc.collect()
    assert effects.join_finalizers(timeout=10)  # its cleanup runs in a thread of its own
    assert written == []  # no database write from a finalizer
    assert len(queued) == 1 and routed_signals == queued  # handed over, announced once


@pytest.mark.django_db
def test_a_closed_sync_stream_still_records_inline(
    openai_chain: Any, fake_upstream: FakeUpstream, routed_signals: list[str]
) -> None:
    fake_upstream.script("openai", Faults.stream(text="one two three four"))
    events = router.route_stream(
        AuditRequest(task="chat", messages=(Message(role="user", content="hi"),), stream=True)
    )
    next(events)
    events.close()  # type: ignore[attr-defined]
    assert len(routed_signals) == 1
    assert RoutingDecision.objects.filter(request_id=routed_signals[0]).count() == 1


# --- finding 2: the key never leaves through streamed tool-call fragments ------------------

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
# The upstream echoes the key in a call's id, name and arguments; streamed, the arguments
# go out in 8-character fragments, so the key is split across several of them.
ECHO_CALL = {"id": f"call_{KEY}", "name": "lookup", "arguments": {"token": KEY, "q": "x"}}


def v1_tool_arguments(events: list[tuple[str, Any]]) -> tuple[dict[int, str], str]:
    """Each call's assembled arguments, as a client assembles the /v1 stream's deltas,
    and everything the deltas carried (ids, names, arguments) as one text."""
    arguments: dict[int, str] = {}
    seen: list[str] = []
    for _, data in events:
        if data == "[DONE]":
            continue
        for choice in data.get("choices") or []:
            for delta in (choice.get("delta") or {}).get("tool_calls") or []:
                fragment = (delta.get("function") or {}).get("arguments") or ""
                arguments[delta["index"]] = arguments.get(delta["index"], "") + fragment
                seen += [delta.get("id") or "", (delta.get("function") or {}).get("name") or ""]
    return arguments, "".join(seen)


def audit_tool_arguments(events: list[tuple[str, Any]]) -> tuple[dict[int, str], str]:
    arguments: dict[int, str] = {}
    seen: list[str] = []
    for name, data in events:
        if name != "chunk" or "tool_call" not in data:
            continue
        delta = data["tool_call"]
        fragment = (delta.get("function") or {}).get("arguments") or ""
        arguments[delta["index"]] = arguments.get(delta["index"], "") + fragment
        seen += [delta.get("id") or "", (delta.get("function") or {}).get("name") or ""]
    return arguments, "".join(seen)


def assert_no_key(events: list[tuple[str, Any]], body: str, face: str) -> None:
    assemble = v1_tool_arguments if face == "v1" else audit_tool_arguments
    arguments, ids_and_names = assemble(events)
    assert arguments, events  # the call was streamed
    assembled = "".join(arguments.values())
    assert KEY not in assembled and "[redacted]" in assembled
    assert json.loads(arguments[0]) == {"token": "[redacted]", "q": "x"}
    assert KEY not in ids_and_names and KEY not in body
    # No fragment of the key left either (the split the finding saw: "sk-ca" then the rest).
    assert KEY[:12] not in body and KEY[-12:] not in body


STREAM_CALLS = {
    "v1": ("/v1/chat/completions", {**CHAT, "tools": [TOOL], "stream": True}),
    "audit": (
        "/audit/",
        {"task": "t", "messages": MESSAGES, "tools": [TOOL], "stream": True},
    ),
}


@pytest.mark.django_db
@pytest.mark.parametrize("face", ["v1", "audit"])
def test_a_key_in_streamed_tool_call_fragments_never_leaves_wsgi(
    api: Any, openai_chain: Any, fake_upstream: FakeUpstream, face: str
) -> None:
    fake_upstream.script("openai", Fault(tool_calls=[ECHO_CALL]))
    url, body = STREAM_CALLS[face]
    answer = api.post(
        url, data=json.dumps(body), content_type="application/json", HTTP_ACCEPT="text/event-stream"
    )
    assert answer.status_code == 200
    raw = b"".join(answer.streaming_content)
    answer.close()
    assert_no_key(sse_events(raw), raw.decode(), face)
    assert "[redacted]" in raw.decode()


@pytest.mark.django_db(transaction=True)
def test_a_key_in_streamed_tool_call_fragments_never_leaves_asgi(
    user: Any, openai_chain: Any, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("openai", Fault(tool_calls=[ECHO_CALL]), Fault(tool_calls=[ECHO_CALL]))
    token = str(Token.objects.create(user=user).key)
    v1, audit = asgi_settled(token, STREAM_CALLS["v1"], STREAM_CALLS["audit"])
    for face, answer in (("v1", v1), ("audit", audit)):
        assert answer.status_code == 200, answer.text
        assert_no_key(sse_events(answer.content), answer.text, face)


@pytest.mark.django_db
@pytest.mark.usefixtures("driver")
def test_the_router_stream_filters_tool_call_fragments_on_both_drivers(
    openai_chain: Any, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("openai", Fault(tool_calls=[ECHO_CALL]))
    request = AuditRequest(
        task="t",
        messages=(Message(role="user", content="hi"),),
        tools=(Tool(name="lookup", parameters={"type": "object"}),),
        stream=True,
    )
    events = list(router.route_stream(request))
    deltas = [e.tool_call for e in events if isinstance(e, StreamChunk) and e.tool_call]
    assembled = "".join(d.arguments for d in deltas)
    assert json.loads(assembled) == {"token": "[redacted]", "q": "x"}
    assert all(KEY not in (d.id or "") for d in deltas)
    assert isinstance(events[-1], StreamResult)
    assert KEY not in repr(events)


def _frames(guard: KeyGuard, chunks: list[str]) -> list[int]:
    """The length of each piece the filter lets go, chunk by chunk, then at the end."""
    return [len(guard.feed(c)) for c in chunks] + [len(guard.flush())]


@pytest.mark.parametrize("chunks", [["{guess}", "ZZZZ"], ["say {guess}", " and more text", "."]])
def test_the_stream_filter_tells_nothing_of_a_key_by_when_it_lets_text_go(
    chunks: list[str],
) -> None:
    """An attacker who makes the upstream echo a guess must not learn, from where the
    frames break, whether the guess is a prefix of the key (an oracle that recovered a
    key a character at a time): a right and a wrong guess of the same length go out in
    the same pieces. Only the key's first characters (TRIGGER_CHARS) make text wait."""
    for known in range(TRIGGER_CHARS, len(KEY) - 1):  # a whole key is redacted, not a guess
        right = KEY[: known + 1]
        wrong = KEY[:known] + ("X" if KEY[known] != "X" else "Y")
        shapes = [
            _frames(KeyGuard([KEY]), [c.format(guess=guess) for c in chunks])
            for guess in (right, wrong)
        ]
        assert shapes[0] == shapes[1], (known, shapes)


def test_the_stream_filter_still_redacts_a_key_split_anywhere() -> None:
    text = f"before {KEY} between {KEY}{KEY} after"
    for size in (1, 2, 3, 5, 7, 31, 32, 33):
        guard = KeyGuard([KEY])
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        out = "".join(guard.feed(p) for p in pieces) + guard.flush()
        assert out == text.replace(KEY, "[redacted]"), size
    plain = KeyGuard([KEY])
    assert plain.feed("ordinary text ") == "ordinary text "  # nothing held back


@pytest.mark.django_db
def test_the_router_stream_breaks_frames_alike_for_a_right_and_a_wrong_guess(
    openai_chain: Any, fake_upstream: FakeUpstream
) -> None:
    """Through the router's stream (the fake upstream sends a word a chunk)."""
    shapes = []
    for guess in (KEY[:12], KEY[:11] + "X"):
        fake_upstream.script("openai", Faults.stream(text=f"{guess} ZZZZ ZZZZ"))
        request = AuditRequest(
            task="t", messages=(Message(role="user", content="hi"),), stream=True
        )
        events = list(router.route_stream(request))
        shapes.append([len(e.text) for e in events if isinstance(e, StreamChunk)])
    assert shapes[0] == shapes[1]


def _escaped(text: str) -> str:
    return "".join(f"\\u{ord(ch):04x}" for ch in text)


#: The key written with JSON ``\\u`` escapes: a client's JSON decoder reads the key.
ESCAPED_ARGUMENTS = JSONText('{"token": "' + _escaped(KEY) + '", "q": "x"}')


@pytest.mark.django_db
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_key_spelled_with_json_escapes_in_tool_call_arguments_never_leaves(
    openai_chain: Any, fake_upstream: FakeUpstream, stream: bool
) -> None:
    fake_upstream.script(
        "openai", Fault(tool_calls=[{"name": "lookup", "arguments": ESCAPED_ARGUMENTS}])
    )
    request = AuditRequest(
        task="t",
        messages=(Message(role="user", content="hi"),),
        tools=(Tool(name="lookup", parameters={"type": "object"}),),
        stream=stream,
    )
    if stream:
        events = list(router.route_stream(request))
        deltas = [e.tool_call for e in events if isinstance(e, StreamChunk) and e.tool_call]
        arguments = "".join(d.arguments for d in deltas)
        final = events[-1]
        assert isinstance(final, StreamResult)
        whole = final.routed.result.tool_calls[0].arguments
    else:
        routed = router.route(request)
        arguments = whole = routed.result.tool_calls[0].arguments
    for text in (arguments, whole):
        assert json.loads(text) == {"token": "[redacted]", "q": "x"}, text


@pytest.mark.django_db
def test_the_messages_face_never_decodes_an_escaped_key_into_its_answer(
    openai_chain: Any, fake_upstream: FakeUpstream, api: Any
) -> None:
    fake_upstream.script(
        "openai", Fault(tool_calls=[{"name": "lookup", "arguments": ESCAPED_ARGUMENTS}])
    )
    tools = [{"name": "lookup", "input_schema": {"type": "object"}}]
    said = [{"role": "user", "content": "hi"}]
    body = {"model": "default", "max_tokens": 64, "messages": said, "tools": tools}
    response = api.post("/v1/messages", body, format="json")
    assert response.status_code == 200, response.content
    assert KEY not in response.content.decode()
    assert KEY not in json.dumps(response.json())


# --- item 3: one availability decision, one failure policy ---------------------------------


@pytest.mark.django_db
def test_explain_and_a_forced_call_agree_on_an_open_circuit(
    scripted: Any, key_env: str, clock: Any
) -> None:
    """One decision (availability.may_try): explain used to say "try" for a forced
    provider whose circuit is open, while the forced call answered circuit_open."""
    from llm_routing.resilience import breaker
    from llm_routing.resilience.breaker import OPEN, Circuit
    from tests.conftest import make_provider

    row = make_provider("a")
    now = clock()
    breaker.store.save(
        Circuit(provider="a", model=row.model, state=OPEN, failures=3, level=1,
                opened_at=now, open_until=now + 30, last_error_category="unavailable")
    )  # fmt: skip
    request = AuditRequest(task="t", input_text="x", force_provider="a")
    explained = router.explain(request).candidates[0]
    routed = router.route(request)
    assert routed.metadata.attempts[0].reason == "circuit_open"
    assert (explained.verdict, explained.reason) == ("skip", "circuit_open")
    assert scripted.calls == []


def test_the_failure_policy_is_carried_by_the_error() -> None:
    """ProviderError's class decides; the ErrorInfo carries it; the walk and the breaker
    read it (``advances``, ``counts``, ``observed``)."""
    from llm_routing import errors
    from llm_routing.resilience import breaker

    table = {
        errors.RateLimitError: (True, True, True),
        errors.UnavailableError: (True, True, True),
        errors.NetworkError: (True, True, True),
        errors.ProviderTimeoutError: (True, True, True),
        errors.BudgetExhaustedError: (True, False, False),
        errors.ContextLengthError: (True, False, True),
        errors.AuthenticationError: (False, False, True),
        errors.InvalidRequestError: (False, False, True),
        errors.ContentPolicyError: (False, False, True),
        errors.ResponseError: (False, False, True),
        errors.ClientDisconnectedError: (False, False, False),
    }
    for cls, policy in table.items():
        info = cls().to_info()
        assert (info.advances, info.counts, info.observed) == policy, cls
        assert breaker.counts(info) is policy[1]
        # An ErrorInfo built without its class (a test, a skip) gets the same table.
        bare = type(info)(category=info.category, message="", transient=info.transient)
        assert (bare.advances, bare.counts, bare.observed) == policy, cls
    # An instance's policy is what is read: a ProviderError made to stop the walk does.
    odd = errors.UnavailableError()
    odd.advances = False
    assert odd.to_info().advances is False


def test_the_failure_policy_is_one_table() -> None:
    """Every error class's policy and every ErrorInfo's come from one function,
    ``failure_policy.policy_for`` (nothing else states it), and the taxonomy's two
    sides agree with the table's ``transient``."""
    from llm_routing import errors
    from llm_routing.failure_policy import Policy, policy_for

    concrete = [
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type)
        and issubclass(cls, errors.ProviderError)
        and "category" in cls.__dict__
    ]
    assert len(concrete) == 12  # ProviderError itself is a response error
    # No class body of errors.py states a policy attribute: the table alone does.
    stated = {
        target.id
        for node in ast.walk(ast.parse(Path(errors.__file__).read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.Assign | ast.AnnAssign)
        if item.value is not None
        for target in (item.targets if isinstance(item, ast.Assign) else [item.target])
        if isinstance(target, ast.Name)
    }
    assert stated == {"category", "default_message"}
    for cls in concrete:
        policy = policy_for(cls.category)
        assert (cls.transient, cls.retryable, cls.advances, cls.counts_toward_circuit,
                cls.observed) == (policy.transient, policy.retryable, policy.advances,
                                  policy.counts, policy.observed), cls  # fmt: skip
        assert issubclass(cls, errors.TransientError) is policy.transient, cls
        info = ErrorInfo(category=cls.category, message="", transient=policy.transient)
        assert (info.advances, info.counts, info.observed) == (
            policy.advances,
            policy.counts,
            policy.observed,
        )
    # A kind that is no provider failure (a skip, chain_exhausted) follows its flag.
    assert policy_for("chain_exhausted", transient=True) == Policy(True, False, True, True)
    assert policy_for("circuit_open") == Policy(False, False, False, False)


def test_json_escapes_decode_to_the_same_json_however_the_fragments_fall() -> None:
    """What the arguments' escape decoding writes means the same to a JSON decoder: a
    quote, a backslash, a control character and a lone surrogate stay escaped; a pair
    becomes its character; an escaped backslash is never taken for an escape."""
    from llm_routing.sanitize import JsonEscapes

    source = '{"a": "\\u0073k-\\ud83d\\ude00 \\\\u0041 \\u0022 \\/ \\n \\udc00 \\ud800x"}'
    for size in range(1, 14):
        escapes = JsonEscapes()
        pieces = [source[i : i + size] for i in range(0, len(source), size)]
        out = "".join(escapes.feed(p) for p in pieces) + escapes.flush()
        assert json.loads(out) == json.loads(source), (size, out)
        assert "sk-\U0001f600" in out and "\\u0022" in out and "\\\\u0041" in out
