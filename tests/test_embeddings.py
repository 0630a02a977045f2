"""``POST /v1/embeddings`` and ``llm_routing.embed()`` / ``aembed()`` x every vendor kind
behind them, over real HTTP to the fake upstream (its embeddings wire formats): whole
answers (float and base64), failover between candidates of one vector length, the
``dimension_mismatch`` and ``unsupported`` skips, a wrong-length upstream (502, never
returned), every candidate skipped (503 in OpenAI's envelope), a budget and a
permission refusing, strict parsing, the record (length and SHA-256 of the input),
``/v1/models`` and the key in no answer."""

from __future__ import annotations

import array
import base64
import hashlib
import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

import llm_routing
from llm_routing.models import Attempt, Budget, Provider, RoutingDecision
from llm_routing.providers.embeddings import MOCK_DIMENSIONS, from_base64, to_base64
from llm_routing.types import AuditRequest

from .conftest import base_url_for, make_chain
from .fakes.upstream import EMBEDDING_DIMENSIONS, FakeUpstream, Faults, fake_vector

pytestmark = pytest.mark.django_db

PATH = "/v1/embeddings"
KINDS = ("openai", "openai_compatible", "gemini", "mock")
VENDOR = {"openai": "openai", "openai_compatible": "openai", "gemini": "gemini"}
TEXTS = ["The food was delicious.", "The waiter was friendly."]


def row(name: str, kind: str, fake: FakeUpstream, **fields: Any) -> Provider:
    if kind == "mock":
        return Provider.objects.create(name=name, kind="mock", model="mock-1", **fields)
    fields.setdefault("max_retries", 0)
    return Provider.objects.create(
        name=name,
        kind=kind,
        model=f"{kind}-model",
        base_url=base_url_for(kind, fake),
        api_key_env="TEST_PROVIDER_KEY",
        timeout_s=5.0,
        **fields,
    )


@pytest.fixture
def post(api: APIClient, key_env: str) -> Callable[..., Any]:
    """POST a body to the face; asserts the status and that the key is in no answer."""

    def call(body: dict[str, Any], status: int = 200) -> Any:
        response = api.post(PATH, body, format="json")
        assert response.status_code == status, response.content
        assert key_env not in response.content.decode()
        return response.json()

    return call


def vectors(answer: dict[str, Any]) -> list[list[float]]:
    assert answer["object"] == "list"
    assert [d["index"] for d in answer["data"]] == list(range(len(answer["data"])))
    assert all(d["object"] == "embedding" for d in answer["data"])
    return [d["embedding"] for d in answer["data"]]


def attempts(answer_request_id: str | None = None) -> list[tuple[str, str, str | None]]:
    decision = RoutingDecision.objects.get()
    return [
        (a.provider, a.outcome, a.reason or a.error_category or None)
        for a in Attempt.objects.filter(decision=decision).order_by("index")
    ]


# --- every kind --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("many", [False, True], ids=["one", "many"])
def test_each_kind_embeds(kind, many, fake_upstream, post):
    make_chain("emb", [row("p", kind, fake_upstream)])
    answer = post({"model": "emb", "input": TEXTS if many else TEXTS[0]})
    got = vectors(answer)
    assert len(got) == (2 if many else 1)
    size = MOCK_DIMENSIONS if kind == "mock" else EMBEDDING_DIMENSIONS
    assert all(len(v) == size for v in got)
    assert answer["usage"]["prompt_tokens"] > 0
    assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"]
    decision = RoutingDecision.objects.get()
    assert decision.task == "embeddings" and decision.selected_provider == "p"
    if kind == "mock":
        assert abs(math.fsum(x * x for x in got[0]) - 1.0) < 1e-9  # a unit vector
        return
    assert answer["model"] == f"{kind}-model"
    (sent,) = fake_upstream.requests_for(VENDOR[kind])
    body = sent.json
    if kind == "gemini":
        method = "batchEmbedContents" if many else "embedContent"
        assert sent.path.endswith(f"/models/gemini-model:{method}")
        assert sent.headers["x-goog-api-key"]  # the key in the header, never the URL
        texts = [r["content"]["parts"][0]["text"] for r in body["requests"]] if many else None
        assert texts in (None, TEXTS)
        # Gemini reports no usage: four characters a token.
        expected = sum((len(t) + 3) // 4 for t in (TEXTS if many else TEXTS[:1]))
        assert answer["usage"]["prompt_tokens"] == expected
    else:
        assert sent.path == "/v1/embeddings"
        assert body["encoding_format"] == "base64"  # asked and decoded, as the SDK does
        assert body["input"] == (TEXTS if many else TEXTS[:1])
        assert "temperature" not in body
        # The base64 the upstream sent, decoded to float32: the fake's vector.
        expected_vector = array.array("f", fake_vector(TEXTS[0], EMBEDDING_DIMENSIONS))
        assert got[0] == pytest.approx(list(expected_vector))


@pytest.mark.parametrize("kind", ("openai", "gemini", "mock"))
def test_base64_answers_the_float_vectors_as_little_endian_float32(kind, fake_upstream, post):
    make_chain("emb", [row("p", kind, fake_upstream)])
    floats = vectors(post({"model": "emb", "input": TEXTS}))
    encoded = vectors(post({"model": "emb", "input": TEXTS, "encoding_format": "base64"}))
    for as_float, as_text in zip(floats, encoded, strict=True):
        raw = base64.b64decode(as_text)
        decoded = array.array("f")
        decoded.frombytes(raw)
        assert list(decoded) == pytest.approx(as_float, rel=1e-6)


def test_the_requested_dimensions_are_sent_and_answered(fake_upstream, post):
    make_chain("emb", [row("o", "openai", fake_upstream), row("g", "gemini", fake_upstream)])
    got = vectors(post({"model": "emb", "input": ["a", "b"], "dimensions": 5, "user": "u-1"}))
    assert [len(v) for v in got] == [5, 5]
    (sent,) = fake_upstream.requests_for("openai")
    assert sent.json["dimensions"] == 5 and sent.json["user"] == "u-1"
    make_chain("gem", [row("g2", "gemini", fake_upstream)])
    post({"model": "gem", "input": "a", "dimensions": 3})
    (gemini,) = fake_upstream.requests_for("gemini")
    assert gemini.json["outputDimensionality"] == 3


def test_token_arrays_reach_openai_as_lists_and_gemini_is_skipped(fake_upstream, post):
    make_chain("emb", [row("p", "openai_compatible", fake_upstream)])
    assert len(vectors(post({"model": "emb", "input": [1, 2, 3]}))) == 1
    assert len(vectors(post({"model": "emb", "input": [[1, 2], [3]]}))) == 2
    bodies = [r.json["input"] for r in fake_upstream.requests_for("openai")]
    assert bodies == [[[1, 2, 3]], [[1, 2], [3]]]
    # Gemini embeds texts only: for token arrays it is a candidate that cannot serve
    # (skipped as unsupported, like a chat-only row), so the walk goes on past it.
    make_chain("gem", [row("g", "gemini", fake_upstream)])
    error = post({"model": "gem", "input": [1, 2, 3]}, status=503)["error"]
    assert [(c["provider"], c["reason"]) for c in error["candidates"]] == [("g", "unsupported")]
    make_chain("mixed", [row("g2", "gemini", fake_upstream), row("o", "openai", fake_upstream)])
    answer = post({"model": "mixed", "input": [[1, 2], [3]]})
    assert len(vectors(answer)) == 2
    assert fake_upstream.requests_for("gemini") == []
    # Texts still go to Gemini first.
    post({"model": "mixed", "input": ["a text"]})
    assert len(fake_upstream.requests_for("gemini")) == 1


# --- failover and the dimension rule -------------------------------------------------------


def test_failover_between_two_openai_compatible_candidates_of_one_length(fake_upstream, post):
    make_chain(
        "emb",
        [
            row("a", "openai_compatible", fake_upstream, embedding_dimensions=8),
            row("b", "openai_compatible", fake_upstream, embedding_dimensions=8),
        ],
    )
    fake_upstream.script("openai", Faults.unavailable("openai", 503))
    answer = post({"model": "emb", "input": TEXTS})
    assert [len(v) for v in vectors(answer)] == [8, 8]
    assert attempts() == [("a", "error", "unavailable"), ("b", "ok", None)]
    assert len(fake_upstream.requests_for("openai")) == 2


def test_a_candidate_of_another_declared_length_is_skipped(fake_upstream, post):
    make_chain(
        "emb",
        [
            row("a", "openai", fake_upstream, embedding_dimensions=8),
            row("b", "openai", fake_upstream, embedding_dimensions=16),
            row("c", "gemini", fake_upstream, embedding_dimensions=8),
        ],
    )
    fake_upstream.script("openai", Faults.unavailable("openai", 503))
    answer = post({"model": "emb", "input": TEXTS})
    assert [len(v) for v in vectors(answer)] == [8, 8]
    assert attempts() == [
        ("a", "error", "unavailable"),
        ("b", "skipped", "dimension_mismatch"),
        ("c", "ok", None),
    ]
    assert len(fake_upstream.requests_for("openai")) == 1  # b was never called


def test_the_requested_dimensions_are_the_target(fake_upstream, post):
    make_chain(
        "emb",
        [
            row("a", "openai", fake_upstream, embedding_dimensions=8),
            row("b", "openai", fake_upstream, embedding_dimensions=4),
        ],
    )
    answer = post({"model": "emb", "input": "x", "dimensions": 4})
    assert [len(v) for v in vectors(answer)] == [4]
    assert attempts() == [("a", "skipped", "dimension_mismatch"), ("b", "ok", None)]


def test_a_wrong_length_answer_is_a_502_and_never_returned(fake_upstream, post):
    make_chain(
        "emb",
        [
            row("a", "openai", fake_upstream, embedding_dimensions=8),
            row("b", "openai", fake_upstream, embedding_dimensions=8),
        ],
    )
    fake_upstream.script("openai", Faults.ok(dimensions=12))
    error = post({"model": "emb", "input": TEXTS}, status=502)["error"]
    assert error["code"] == "upstream_bad_response" and "12-dimensional" in error["message"]
    assert attempts() == [("a", "error", "response")]  # a provider fault: no failover


def test_an_undeclared_candidate_is_held_to_the_first_declared_length(fake_upstream, post):
    """The first candidate declares nothing, the second 8: the target is 8, so the
    first's 12-long answer is refused (never mixed with the second's space)."""
    make_chain(
        "emb",
        [
            row("a", "openai", fake_upstream),
            row("b", "openai", fake_upstream, embedding_dimensions=8),
        ],
    )
    fake_upstream.script("openai", Faults.ok(dimensions=12))
    post({"model": "emb", "input": "x"}, status=502)


def test_anthropic_is_skipped_as_unsupported(fake_upstream, post):
    make_chain(
        "emb",
        [
            Provider.objects.create(
                name="claude",
                kind="anthropic",
                model="claude-x",
                base_url=base_url_for("anthropic", fake_upstream),
                api_key_env="TEST_PROVIDER_KEY",
            ),
            row("oc", "openai_compatible", fake_upstream),
        ],
    )
    post({"model": "emb", "input": "x"})
    assert attempts() == [("claude", "skipped", "unsupported"), ("oc", "ok", None)]
    assert fake_upstream.requests_for("anthropic") == []


def test_a_row_can_turn_embeddings_off(fake_upstream, post):
    make_chain("emb", [row("chat-only", "openai", fake_upstream, supports_embeddings=False)])
    error = post({"model": "emb", "input": "x"}, status=503)["error"]
    assert error["candidates"] == [
        {"provider": "chat-only", "outcome": "skipped", "reason": "unsupported"}
    ]


def test_all_candidates_skipped_is_a_503_in_openais_envelope(fake_upstream, post):
    make_chain(
        "emb",
        [
            Provider.objects.create(
                name="claude", kind="anthropic", model="c", api_key_env="TEST_PROVIDER_KEY"
            ),
            row("off", "openai", fake_upstream, enabled=False),
        ],
    )
    error = post({"model": "emb", "input": "x"}, status=503)["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "no_provider_available"
    assert [c["reason"] for c in error["candidates"]] == ["unsupported", "disabled"]
    assert fake_upstream.requests == []


def test_a_budget_refuses_in_openais_envelope(fake_upstream, post):
    make_chain("emb", [row("p", "mock", fake_upstream)])
    Budget.objects.create(name="alice-1", scope="user", subject="alice", max_requests=1)
    post({"model": "emb", "input": "x"})
    error = post({"model": "emb", "input": "x"}, status=429)["error"]
    assert error["type"] == "rate_limit_error" and error["budget"] == "alice-1"


def test_a_model_the_caller_may_not_use_is_a_404_as_one_that_does_not_exist(fake_upstream, post):
    from django.contrib.auth.models import Group

    from llm_routing.models import Chain

    Chain.objects.create(name="vip").allowed_groups.add(Group.objects.create(name="vips"))
    hidden = post({"model": "vip", "input": "x"}, status=404)["error"]
    absent = post({"model": "nowhere", "input": "x"}, status=404)["error"]
    assert hidden["message"].replace("vip", "X") == absent["message"].replace("nowhere", "X")
    assert hidden["code"] == absent["code"] == "model_not_found"
    assert not RoutingDecision.objects.exists()


def test_the_key_is_in_no_answer_even_when_the_upstream_echoes_it(fake_upstream, post):
    make_chain("emb", [row("p", "openai", fake_upstream)])
    fake_upstream.script("openai", Faults.auth("openai", echo_key=True))
    error = post({"model": "emb", "input": "x"}, status=502)["error"]  # checked by post
    assert error["code"] == "upstream_authentication"


# --- the record, usage and cost ------------------------------------------------------------


def test_the_record_keeps_the_inputs_length_and_hash_only_and_the_cost(fake_upstream, post):
    prices = {"input_price_per_mtok": 1, "output_price_per_mtok": 2}
    make_chain("emb", [row("p", "openai", fake_upstream, **prices)])
    answer = post({"model": "emb", "input": TEXTS})
    # The fake reports a token per word: 8 tokens at 1 USD per million.
    assert answer["usage"]["prompt_tokens"] == 8
    assert answer["usage"]["cost_usd"] == pytest.approx(8e-6)
    decision = RoutingDecision.objects.get()
    canonical = json.dumps(TEXTS, ensure_ascii=False, separators=(",", ":"))
    assert decision.input_length == len(canonical)
    assert decision.input_sha256 == hashlib.sha256(canonical.encode()).hexdigest()
    stored = json.dumps([list(r) for r in RoutingDecision.objects.values_list()], default=str)
    assert "delicious" not in stored
    attempt = Attempt.objects.get(decision=decision)
    assert float(attempt.cost_usd) == pytest.approx(8e-6)


# --- strict parsing --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"temperature": 0.5}, "temperature", "Unrecognized request argument"),
        ({"input": ""}, "input", "may not be empty"),
        ({"input": []}, "input", "at least one"),
        ({"input": ["a", ""]}, "input.1", "may not be empty"),
        ({"input": ["a", [1]]}, "input.1", "every input"),
        ({"input": [[1], "a"]}, "input.1", "every input"),
        ({"input": [1, True]}, "input.0", "every input"),
        ({"input": [[1, -1]]}, "input.0.1", "token id"),
        ({"input": [[]]}, "input.0", "may not be empty"),
        ({"input": 5}, "input", "Expected a string"),
        ({"input": ["a"] * 2049}, "input", "At most 2048"),
        ({"dimensions": 0}, "dimensions", ""),
        ({"dimensions": "8"}, "dimensions", ""),
        ({"encoding_format": "int8"}, "encoding_format", ""),
        ({"user": 5}, "user", ""),
        ({"stream": True}, "stream", "Unrecognized request argument"),
    ],
)
def test_strict_parsing_names_the_parameter(change, param, words, post):
    make_chain("emb", [Provider.objects.create(name="p", kind="mock", model="m")])
    error = post({"model": "emb", "input": "x", **change}, status=400)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert words in error["message"]
    if param in change and words.startswith("Unrecognized"):
        assert error["code"] == "unknown_parameter"
    assert not RoutingDecision.objects.exists()


def test_an_overlong_text_is_refused(post, settings):
    settings.LLM_ROUTING = {"MAX_INPUT_CHARS": 10}
    make_chain("emb", [Provider.objects.create(name="p", kind="mock", model="m")])
    error = post({"model": "emb", "input": ["short", "x" * 11]}, status=400)["error"]
    assert error["param"] == "input.1"


# --- /v1/models ------------------------------------------------------------------------------


def test_models_shows_which_names_serve_embeddings(api, fake_upstream):
    claude = Provider.objects.create(name="claude", kind="anthropic", model="c")
    make_chain("chat", [claude])
    make_chain("emb", [claude, row("oc", "openai_compatible", fake_upstream)])
    listed = {m["id"]: m["faces"] for m in api.get("/v1/models").json()["data"]}
    chat_faces = ["/v1/chat/completions", "/v1/responses", "/v1/messages"]
    assert listed["chat"] == listed["claude"] == chat_faces
    assert listed["emb"] == listed["oc"] == listed["mock"] == [*chat_faces, "/v1/embeddings"]


# --- the Python API --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # aembed records from a worker thread
def test_embed_and_aembed(fake_upstream, key_env, async_transport):
    make_chain("emb", [row("p", "openai", fake_upstream, embedding_dimensions=8)])
    routed = llm_routing.embed(TEXTS, chain="emb")
    assert routed.result.ok and [len(v) for v in routed.result.vectors] == [8, 8]

    async def embed_async() -> Any:
        return await llm_routing.aembed(TEXTS, chain="emb")

    again = async_to_sync(embed_async)()
    assert [list(v) for v in again.result.vectors] == [list(v) for v in routed.result.vectors]
    assert RoutingDecision.objects.filter(task="embeddings").count() == 2
    with pytest.raises(ValidationError) as bad:
        llm_routing.embed([], chain="emb")
    assert "input" in bad.value.message_dict


def test_embed_falls_back_to_the_mocks_vectors_of_the_target_length(fake_upstream, key_env):
    make_chain("emb", [row("p", "openai", fake_upstream, embedding_dimensions=8)])
    fake_upstream.script("openai", Faults.unavailable("openai", 503))
    routed = llm_routing.embed("hello", chain="emb")
    assert routed.result.provider == "mock" and routed.metadata.fallback_used
    assert [len(v) for v in routed.result.vectors] == [8]
    same = llm_routing.embed("hello", provider="mock")
    assert len(same.result.vectors[0]) == MOCK_DIMENSIONS
    with pytest.raises(ValidationError):
        llm_routing.embed("x", chain="no-such-chain")


def test_base64_round_trip_helpers():
    vector = [0.5, -0.25, 1.0]
    assert list(from_base64(to_base64(vector))) == vector
    request = AuditRequest(task="embeddings", call="embed", inputs=("a", (1, 2)))
    assert request.required_capabilities == frozenset({"embeddings", "token_inputs"})
    texts = AuditRequest(task="embeddings", call="embed", inputs=("a", "b"))
    assert texts.required_capabilities == frozenset({"embeddings"})
    assert request.input_length == len('["a",[1,2]]')


# --- configuration: config as code and the admin ------------------------------------------


def test_config_as_code_carries_the_embeddings_fields():
    from llm_routing import config_io

    text = (
        "version = 1\n\n"
        "[providers.vectors]\n"
        'kind = "openai_compatible"\n'
        'model = "nomic-embed-text"\n'
        'base_url = "http://127.0.0.1:11434/v1"\n'
        "supports_embeddings = true\n"
        "embedding_dimensions = 768\n\n"
        "[providers.chat]\n"
        'kind = "openai"\n'
        'model = "gpt-4o-mini"\n'
        "supports_embeddings = false\n"
    )
    config_io.apply(text)
    row = Provider.objects.get(name="vectors")
    assert (row.supports_embeddings, row.embedding_dimensions) == (True, 768)
    assert Provider.objects.get(name="chat").embedding_dimensions is None
    exported = config_io.export()
    assert "embedding_dimensions = 768" in exported and "supports_embeddings = false" in exported
    assert exported.count("embedding_dimensions") == 1  # an undeclared one is left out
    config_io.apply(exported)
    assert config_io.export() == exported  # byte-for-byte round trip
    with pytest.raises(config_io.ConfigError) as bad:
        config_io.apply(text.replace("= 768", '= "768"'))
    assert "embedding_dimensions" in str(bad.value)


def test_the_admin_form_edits_the_embeddings_fields(admin_client):
    from django.urls import reverse

    row = Provider.objects.create(name="vectors", kind="openai", model="text-embedding-3-small")
    url = reverse("admin:llm_routing_provider_change", args=[row.pk])
    page = admin_client.get(url).content.decode()
    assert 'name="supports_embeddings"' in page and 'name="embedding_dimensions"' in page
    assert "embeddings: yes" in page  # the effective capability, from the kind


def test_the_mock_answers_no_more_numbers_than_an_upstream_may(post):
    make_chain("emb", [Provider.objects.create(name="p", kind="mock", model="m")])
    error = post({"model": "emb", "input": ["x"] * 2048, "dimensions": 65_536}, status=400)
    assert "MAX_RESPONSE_BYTES" in error["error"]["message"]


# --- metrics ---------------------------------------------------------------------------------


def test_metrics_count_embeddings_as_chat_and_the_dimension_skip(fake_upstream, post, client):
    from django.test import override_settings
    from prometheus_client.parser import text_string_to_metric_families

    def scrape() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer metrics-token-0123456789")
        assert response.status_code == 200
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.content.decode())
            for s in family.samples
        }

    make_chain(
        "emb",
        [
            row("wide", "openai", fake_upstream, embedding_dimensions=16),
            row("narrow", "openai", fake_upstream, embedding_dimensions=8),
        ],
    )
    with override_settings(LLM_ROUTING={"METRICS_TOKEN": "metrics-token-0123456789"}):
        before = scrape()
        post({"model": "emb", "input": TEXTS, "dimensions": 8})
        after = scrape()
    changed = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    skip = (
        "llm_routing_skips_total",
        frozenset({("provider", "wide"), ("reason", "dimension_mismatch")}),
    )
    assert changed[skip] == 1
    requests = [k for k in changed if k[0] == "llm_routing_requests_total"]
    assert len(requests) == 1 and ("chain", "emb") in requests[0][1]
    tokens = [v for k, v in changed.items() if k[0] == "llm_routing_tokens_total"]
    assert sum(tokens) == 8  # the fake's usage: a token per word
