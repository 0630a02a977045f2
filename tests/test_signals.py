"""Signals fire in order, carry no input or key, and a raising receiver changes nothing."""

from __future__ import annotations

import pytest

from llm_routing.errors import UnavailableError
from llm_routing.router import route
from llm_routing.signals import after_provider_result, before_provider_call, on_provider_fallback
from llm_routing.types import AuditRequest

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def chain(scripted, key_env):
    a = make_provider("a", enabled=False)
    b = make_provider("b", max_retries=0)
    c = make_provider("c")
    make_chain("main", [a, b, c], is_default=True)
    scripted.scripts["b"] = [UnavailableError()]
    return scripted


def test_signals_fire_with_safe_arguments(chain, key_env):
    events: list[tuple[str, dict]] = []

    def on(name):
        def receiver(sender, **kwargs):
            events.append((name, kwargs))

        return receiver

    receivers = [
        (before_provider_call, on("before")),
        (after_provider_result, on("after")),
        (on_provider_fallback, on("fallback")),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver)
    try:
        routed = route(AuditRequest(task="t", input_text="INPUT-XYZ"), sleeper=lambda s: None)
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    names = [(n, k.get("provider")) for n, k in events]
    assert names == [
        ("fallback", "a"),
        ("before", "b"),
        ("after", "b"),
        ("fallback", "b"),
        ("before", "c"),
        ("after", "c"),
    ]
    assert events[0][1]["reason"] == "disabled"
    assert events[3][1]["reason"] == "unavailable"
    assert all(k["request_id"] == routed.request_id for _, k in events)
    flat = repr(events)
    assert "INPUT-XYZ" not in flat and key_env not in flat


def test_raising_receivers_never_change_the_result(chain, caplog):
    baseline = route(AuditRequest(task="t", input_text="x"), sleeper=lambda s: None)
    chain.scripts["b"] = [UnavailableError()]

    def boom(sender, **kwargs):
        raise RuntimeError("receiver failure")

    for signal in (before_provider_call, after_provider_result, on_provider_fallback):
        signal.connect(boom)
    try:
        routed = route(AuditRequest(task="t", input_text="x"), sleeper=lambda s: None)
    finally:
        for signal in (before_provider_call, after_provider_result, on_provider_fallback):
            signal.disconnect(boom)
    assert routed.result.provider == baseline.result.provider == "c"
    assert routed.result.output == baseline.result.output
    assert routed.metadata.skipped_providers == baseline.metadata.skipped_providers
    assert routed.metadata.attempted_providers == baseline.metadata.attempted_providers
    assert "raised RuntimeError" in caplog.text


def test_request_routed_is_sent_once_per_request_streams_included(chain, key_env):
    from llm_routing.router import route_stream
    from llm_routing.signals import request_routed
    from llm_routing.types import StreamResult

    seen: list[tuple[str, object, object]] = []

    def receiver(sender, *, request_id, request, routed, **kwargs):
        seen.append((request_id, request, routed))

    def broken(sender, **kwargs):
        raise RuntimeError("a broken receiver")

    request = AuditRequest(task="t", input_text="x")
    request_routed.connect(receiver)
    request_routed.connect(broken)
    try:
        routed = route(request)
        events = list(route_stream(AuditRequest(task="t", input_text="y", stream=True)))
    finally:
        request_routed.disconnect(receiver)
        request_routed.disconnect(broken)
    assert routed.result.ok and routed.result.provider == "c"  # the raise changed nothing
    assert isinstance(events[-1], StreamResult)
    assert seen[0] == (routed.request_id, request, routed)
    assert len(seen) == 2 and seen[1][2] is events[-1].routed
