"""End to end with the official clients against a live server: the snippets of
docs/clients.md (the ``openai`` SDK's ``responses.create`` whole and streamed with a
function tool, the ``anthropic`` SDK's ``messages.create`` and ``messages.stream`` with
a tool round trip, the OpenAI Agents SDK with its default model and one function tool)
are run as written, for each vendor kind serving the chain; then what the SDKs make of
a failure after the commit point and of a refused request."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from django.test import override_settings
from rest_framework.authtoken.models import Token

from llm_routing.models import Provider, RoutingDecision

from .conftest import base_url_for, make_chain
from .docs_blocks import DOCS, blocks
from .fakes.upstream import EMBEDDING_DIMENSIONS, FakeUpstream, Faults

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ("openai_compatible", "anthropic", "gemini")
VENDOR = {"openai_compatible": "openai", "anthropic": "anthropic", "gemini": "gemini"}
#: The kind serving the ``embeddings`` chain when the chat chain is of a kind.
VENDOR_KIND = {"openai_compatible": "openai_compatible", "anthropic": "openai_compatible",
               "gemini": "gemini"}  # fmt: skip


def agents_default_model() -> str | None:
    try:
        from agents.models import get_default_model
    except ImportError:  # the Agents SDK is optional in the dev requirements
        return None
    return str(get_default_model())


@pytest.fixture
def token(user: Any) -> str:
    return str(Token.objects.create(user=user).key)


def serve(kind: str, fake: FakeUpstream) -> None:
    """The chain ``default`` (and one named after the Agents SDK's default model), and
    ``embeddings``: a provider of ``kind`` where it serves embeddings, else an
    ``openai_compatible`` one."""
    provider = Provider.objects.create(
        name="p",
        kind=kind,
        model=f"{kind}-model",
        base_url=base_url_for(kind, fake),
        api_key_env="TEST_PROVIDER_KEY",
    )
    make_chain("default", [provider])
    embedder = kind if kind != "anthropic" else "openai_compatible"
    embeddings = Provider.objects.create(
        name="e",
        kind=embedder,
        model=f"{embedder}-embedding-model",
        base_url=base_url_for(embedder, fake),
        api_key_env="TEST_PROVIDER_KEY",
        embedding_dimensions=EMBEDDING_DIMENSIONS,
    )
    make_chain("embeddings", [embeddings])
    if (model := agents_default_model()) is not None:
        make_chain(model, [provider])


@pytest.mark.parametrize("kind", KINDS)
def test_the_clients_page_runs_against_a_live_server(
    kind, live_server, token, fake_upstream, key_env, monkeypatch
):
    serve(kind, fake_upstream)
    monkeypatch.setenv("LLMR_BASE_URL", live_server.url)
    monkeypatch.setenv("LLMR_TOKEN", token)
    namespace: dict[str, Any] = {"__name__": "docs_clients"}
    for block in blocks(DOCS / "clients.md"):
        if block.lang != "python":
            continue
        if "from agents import" in block.text and agents_default_model() is None:
            continue
        exec(compile(block.text, block.where, "exec"), namespace)
    ns = namespace
    # responses.create with a function tool, then the result sent back
    assert ns["call"].name == "get_weather" and set(ns["arguments"]) == {"city"}
    assert ns["final"].output_text and ns["final"].status == "completed"
    assert ns["streamed_text"]
    # messages.create → tool_use, messages.stream with the tool_result → text
    assert ns["tool_use"].name == "get_weather" and set(ns["tool_use"].input) == {"city"}
    assert ns["answer_text"] and ns["answer"].stop_reason == "end_turn"
    assert ns["answer"].content[0].text == ns["answer_text"]
    assert ns["estimate"].input_tokens > 50  # count_tokens: the conversation and the tool
    assert ("result" in ns) == (agents_default_model() is not None)
    if "result" in ns:  # the Agents SDK called its tool, sent the result back, answered
        assert ns["result"].final_output
        bodies = " ".join(r.body.decode() for r in fake_upstream.requests_for(VENDOR[kind]))
        assert "and sunny in" in bodies  # the tool's own output
    # embeddings.create, base64 (the SDK's default, decoded by it) and float
    assert len(ns["vectors"]) == 2 and {len(v) for v in ns["vectors"]} == {EMBEDDING_DIMENSIONS}
    assert ns["embeddings"].model == ns["as_floats"].model == f"{VENDOR_KIND[kind]}-embedding-model"
    embedded = [r.json for r in fake_upstream.requests if r.path.endswith("/embeddings")]
    if kind != "gemini":  # the app asks its upstream for base64 whatever the client asked
        assert [b["encoding_format"] for b in embedded] == ["base64", "base64"]
    embedding_rows = RoutingDecision.objects.filter(task="embeddings")
    assert embedding_rows.count() == 2 and {d.selected_provider for d in embedding_rows} == {"e"}
    served = RoutingDecision.objects.filter(selected_provider="p").count()
    assert served == RoutingDecision.objects.exclude(task="embeddings").count() >= 7
    vendor_bodies = [r.body.decode() for r in fake_upstream.requests_for(VENDOR[kind])]
    assert any("21 °C" in b or "21 \\u00b0C" in b for b in vendor_bodies)  # the tool result


@pytest.fixture
def claude(live_server, token):
    with anthropic.Anthropic(base_url=live_server.url, api_key=token, max_retries=0) as client:
        yield client


@pytest.fixture
def oai(live_server, token):
    with openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=token, max_retries=0) as client:
        yield client


TEXT = "The quick brown fox jumps over the lazy dog."


def test_a_cut_after_the_commit_point_is_an_error_to_the_anthropic_sdk(
    claude, fake_upstream, key_env
):
    serve("openai_compatible", fake_upstream)
    fake_upstream.script("openai", Faults.stream(text=TEXT, error_after=2))
    received = ""
    with pytest.raises(anthropic.APIStatusError) as raised:
        with claude.messages.stream(
            model="default", max_tokens=100, messages=[{"role": "user", "content": "Go."}]
        ) as stream:
            for text in stream.text_stream:
                received += text
    assert received == "The quick"
    assert "overloaded" in json.dumps(raised.value.body)


def test_a_cut_after_the_commit_point_is_response_failed_to_the_openai_sdk(
    oai, fake_upstream, key_env
):
    serve("anthropic", fake_upstream)
    fake_upstream.script("anthropic", Faults.stream(text=TEXT, error_after=2))
    events = list(oai.responses.create(model="default", input="Go.", stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1].response.status == "failed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        "The quick"
    )


def test_refusals_are_the_sdks_own_errors(claude, oai, fake_upstream, key_env):
    serve("openai_compatible", fake_upstream)
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(
            model="default",
            max_tokens=10,
            messages=[{"role": "user", "content": "Hi"}],
            extra_body={"top_k": 3},
        )
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as stateless:
        oai.responses.create(model="default", input="Hi", previous_response_id="resp_1")
    assert "stateless" in stateless.value.message
    with pytest.raises(anthropic.InternalServerError) as exhausted:
        Provider.objects.update(enabled=False)
        claude.messages.create(
            model="default", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
        )
    assert exhausted.value.status_code == 503


@override_settings(LLM_ROUTING={"STREAM_IDLE_TIMEOUT_S": 2.0})
def test_failover_from_anthropic_to_openai_compatible_under_the_anthropic_sdk(
    claude, fake_upstream, key_env
):
    first = Provider.objects.create(
        name="claude",
        kind="anthropic",
        model="claude-x",
        base_url=base_url_for("anthropic", fake_upstream),
        api_key_env="TEST_PROVIDER_KEY",
        max_retries=0,
    )
    second = Provider.objects.create(
        name="oc",
        kind="openai_compatible",
        model="gpt-x",
        base_url=base_url_for("openai_compatible", fake_upstream),
        api_key_env="TEST_PROVIDER_KEY",
    )
    make_chain("default", [first, second])
    fake_upstream.script("anthropic", Faults.unavailable("anthropic", 529))
    message = claude.messages.create(
        model="default", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
    )
    assert message.model.startswith("gpt-x") and message.content[0].type == "text"
