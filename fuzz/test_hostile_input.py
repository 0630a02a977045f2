"""Hostile input in every string and JSON field of every operation (issue 22), the
Responses, Messages, count_tokens and embeddings faces included.

Each case takes a valid request of one operation — every field the operation has filled
in — and plants one hostile value at a random place of it: a lone surrogate or a NUL
inside a string or a key, ``NaN`` / ``Infinity`` / ``1e400`` for a value, an integer past
64 bits (or past Python's 4,300-digit parse limit), JSON nested 40, 5,000 or 50,000
deep (as a value, or as JSON text where the field carries JSON text: tool-call
``arguments``, explain's ``schema``), a wrong type, invalid UTF-8 bytes in the body; or a
valid but unusual text (astral characters, U+FFFF, line separators, an escaped surrogate
pair) that must be accepted.

Every answer must be below 500 and must not carry the provider's key; every 2xx answer
of a routing operation (``/audit/`` and the ``/v1`` faces, streamed or not) must have
its decision row, found by its request id. Requests go in-process as a token user
through Django's WSGI handler (Django's test client) — a quarter of the body cases
through its ASGI handler (``AsyncClient``) — to the mock provider and to an
OpenAI-compatible provider row pointed at the fake upstream over real HTTP.

Bounded and reproducible: ``LLMR_FUZZ_CASES`` cases in all (10,000 unless set), split
over the operations by :data:`SHARE`, from ``LLMR_FUZZ_SEED``; a failure lists each bad
case as (operation, place, hostile kind) with the case number. docs/fuzzing.md.
"""

from __future__ import annotations

import json
import os
import random
import re
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.core.signals import got_request_exception
from django.test import AsyncClient, Client
from rest_framework.authtoken.models import Token

from llm_routing.models import Chain, ChainEntry, Provider, RoutingDecision
from llm_routing.providers.registry import clear_adapter_cache
from tests.fakes.upstream import FakeUpstream

CASES = int(os.environ.get("LLMR_FUZZ_CASES", "10000"))
SEED = int(os.environ.get("LLMR_FUZZ_SEED", "20261204"))
KEY = "sk-fuzz-KEY-7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d"

#: Each operation's share of the cases.
SHARE = {
    "POST /audit/": 0.24,
    "POST /v1/chat/completions": 0.24,
    "POST /v1/responses": 0.12,
    "POST /v1/messages": 0.12,
    "POST /v1/messages/count_tokens": 0.02,
    "POST /v1/embeddings": 0.06,
    "GET /audit/explain/": 0.12,
    "GET /audit/jobs/{job_id}/": 0.04,
    "GET /health/": 0.02,
    "GET /v1/models": 0.02,
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?", "name": "alice"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "And this picture?"},
            {
                "type": "image_url",
                "image_url": {"url": "https://img.example/a.png", "detail": "low"},
            },
        ],
    },
]
SCHEMA = {
    "type": "object",
    "properties": {"summary": {"type": "string"}, "score": {"type": "number", "minimum": 0}},
    "required": ["summary"],
}


def audit_bodies(model: str) -> list[dict[str, Any]]:
    """Valid /audit/ bodies covering every field (``model``: a provider name)."""
    return [
        {
            "task": "summarize",
            "input_text": "A text to summarize.",
            "instructions": "Be brief.",
            "provider": model,
            "metadata": {"tenant": "acme", "ticket": "T-1"},
            "response_schema": SCHEMA,
            "stream": False,
        },
        {
            "task": "chat",
            "messages": CONVERSATION,
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "force_provider": model,
        },
        {"task": "chat", "messages": CONVERSATION[:2], "route": "fuzz", "stream": True},
    ]


def v1_bodies(model: str) -> list[dict[str, Any]]:
    """Valid /v1/chat/completions bodies covering every parameter."""
    return [
        {
            "model": model,
            "messages": CONVERSATION,
            "tools": [WEATHER],
            "tool_choice": "auto",
            "temperature": 0.5,
            "top_p": 0.9,
            "max_tokens": 64,
            "seed": 7,
            "stop": ["\n\n", "END"],
            "user": "alice",
            "n": 1,
            "logit_bias": {},
            "metadata": {},
        },
        {
            "model": model,
            "messages": CONVERSATION[:2],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
            },
            "max_completion_tokens": 64,
        },
        {
            "model": model,
            "messages": CONVERSATION[:2],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ]


def responses_bodies(model: str) -> list[dict[str, Any]]:
    """Valid /v1/responses bodies covering every parameter the face takes."""
    tool = {"type": "function", **WEATHER["function"]}
    return [
        {
            "model": model,
            "instructions": "Be brief.",
            "input": [
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "Weather in Paris?"},
                    {"type": "input_image", "image_url": "https://img.example/a.png"},
                ]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                 "arguments": '{"city": "Paris", "days": 2}'},
                {"type": "function_call_output", "call_id": "call_1", "output": '{"temp_c": 21}'},
            ],
            "tools": [tool],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "max_output_tokens": 64,
            "temperature": 0.5,
            "top_p": 0.9,
            "metadata": {"tenant": "acme"},
            "user": "alice",
        },
        {
            "model": model,
            "input": "Summarize this.",
            "text": {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA,
                                "strict": True}},
        },
        {"model": model, "input": "Tell me.", "stream": True},
    ]  # fmt: skip


def messages_bodies(model: str) -> list[dict[str, Any]]:
    """Valid /v1/messages bodies covering every parameter the face takes."""
    tool = {"name": "get_weather", "description": "Weather of a city",
            "input_schema": WEATHER["function"]["parameters"]}  # fmt: skip
    return [
        {
            "model": model,
            "max_tokens": 64,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather in Paris?"},
                    {"type": "image", "source": {"type": "url", "url": "https://img.example/a.png"}},
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                     "input": {"city": "Paris", "days": 2}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"},
                ]},
            ],
            "tools": [tool],
            "tool_choice": {"type": "auto"},
            "stop_sequences": ["END"],
            "temperature": 0.5,
            "top_p": 0.9,
            "metadata": {"user_id": "alice"},
        },
        {
            "model": model,
            "max_tokens": 64,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": True,
        },
    ]  # fmt: skip


def embeddings_bodies(model: str) -> list[dict[str, Any]]:
    """Valid /v1/embeddings bodies: a string, strings, token arrays, every parameter."""
    return [
        {"model": model, "input": "A text to embed.", "encoding_format": "float", "user": "u"},
        {"model": model, "input": ["one", "two"], "dimensions": 8, "encoding_format": "base64"},
        {"model": model, "input": [[1, 2, 3], [4, 5]]},
    ]


#: What Anthropic's count_tokens takes of a Messages body.
COUNT_TOKENS_FIELDS = {"model", "system", "messages", "tools", "tool_choice"}


def count_tokens_bodies(model: str) -> list[dict[str, Any]]:
    """Valid /v1/messages/count_tokens bodies: the Messages bodies, what it takes of them."""
    return [
        {k: v for k, v in body.items() if k in COUNT_TOKENS_FIELDS}
        for body in messages_bodies(model)
    ]


#: The body operations: the path, its valid bodies, whether a 2xx has a decision row.
BODY_OPERATIONS: dict[str, tuple[Callable[[str], list[dict[str, Any]]], bool]] = {
    "POST /audit/": (audit_bodies, True),
    "POST /v1/chat/completions": (v1_bodies, True),
    "POST /v1/responses": (responses_bodies, True),
    "POST /v1/messages": (messages_bodies, True),
    "POST /v1/messages/count_tokens": (count_tokens_bodies, False),
    "POST /v1/embeddings": (embeddings_bodies, True),
}


# --- hostile values ----------------------------------------------------------------------

#: Raw JSON tokens json.dumps cannot write; planted as markers, swapped in after dumping.
RAW = {
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "1e400": "1e400",
    "-1e400": "-1e400",
    "int 2**64": str(2**64),
    "int -2**63-1": str(-(2**63) - 1),
    "int 10**100": str(10**100),
    "int 5000 digits": "9" * 5000,
}


def _deep(levels: int, rng: random.Random) -> str:
    if rng.random() < 0.5:
        return "[" * levels + "]" * levels
    return '{"a": ' * levels + "1" + "}" * levels


def _marker(i: int) -> str:
    return f"@@RAW{i}@@"


@dataclass
class Planted:
    """One case: the request and what was planted where."""

    kind: str
    place: str
    raws: dict[str, str]


def _places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every place of a JSON value (the root excluded), in document order."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*path, key), child
            yield from _places(child, (*path, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield (*path, i), child
            yield from _places(child, (*path, i))


def _set(root: Any, path: tuple[Any, ...], value: Any) -> None:
    node = root
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def _insert(text: str, piece: str, rng: random.Random) -> str:
    at = rng.randint(0, len(text))
    return text[:at] + piece + text[at:]


STRING_KINDS = ["surrogate", "nul", "key surrogate", "key nul"]
VALUE_KINDS = [*RAW, "deep 40", "deep 5000", "deep 50000", "wrong type"]
TEXT_JSON_KINDS = ["json text NaN", "json text surrogate", "json text deep 50000"]
BENIGN = [
    "\U0001f600 astral",
    "\uffff",
    "line\u2028separator",
    "e\u0301 combining",
    "\u202eRTL",
    "tab\tand\nnewline",
]


def plant(base: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], Planted]:
    """``base`` (a copy) with one hostile (or unusual but valid) value planted."""
    body = json.loads(json.dumps(base))
    places = list(_places(body))
    path, current = rng.choice(places)
    place = ".".join(str(p) for p in path)
    raws: dict[str, str] = {}
    roll = rng.random()
    if roll < 0.15:  # unusual but valid text (or the request as is): must be accepted
        kind = "benign text"
        if isinstance(current, str):
            _set(body, path, _insert(current, rng.choice(BENIGN), rng))
        return body, Planted(kind, place, raws)
    if isinstance(current, str) and roll < 0.6:
        kind = rng.choice(STRING_KINDS)
        if place.endswith("arguments") or (place.endswith("content") and current.startswith("{")):
            kind = rng.choice([*STRING_KINDS, *TEXT_JSON_KINDS])
        piece = rng.choice(["\ud800", "\udfff", "\udc80"]) if "surrogate" in kind else "\x00"
        if kind.startswith("key"):
            parent = path[:-1]
            node = body
            for part in parent:
                node = node[part]
            if isinstance(node, dict):
                node[_insert(str(path[-1]), piece, rng)] = node.pop(path[-1])
            else:
                _set(body, path, {_insert("k", piece, rng): current})
        elif kind == "json text NaN":
            _set(body, path, '{"a": NaN}')
        elif kind == "json text surrogate":
            _set(body, path, '{"a": "\\ud800"}')
        elif kind == "json text deep 50000":
            _set(body, path, '{"a": ' + "[" * 50_000 + "]" * 50_000 + "}")
        else:
            _set(body, path, _insert(current, piece, rng))
        return body, Planted(kind, place, raws)
    kind = rng.choice(VALUE_KINDS)
    if kind in RAW:
        raws[_marker(0)] = RAW[kind]
        _set(body, path, _marker(0))
    elif kind.startswith("deep"):
        raws[_marker(0)] = _deep(int(kind.split()[1]), rng)
        _set(body, path, _marker(0))
    else:
        _set(body, path, rng.choice([5, -1, 0.5, True, None, "5", [], {}, [None], {"x": 1}]))
    return body, Planted(kind, place, raws)


def encode(body: dict[str, Any], planted: Planted) -> bytes:
    text = json.dumps(body)  # ensure_ascii: lone surrogates travel as \\udXXX escapes
    for marker, raw in planted.raws.items():
        text = text.replace(json.dumps(marker), raw)
    return text.encode()


# --- the run -----------------------------------------------------------------------------


@dataclass
class Outcome:
    status: int
    request_id: str | None
    text: str


class Fuzzer:
    def __init__(self, token: str) -> None:
        headers = {"Authorization": f"Token {token}"}
        self.client = Client(headers=headers, raise_request_exception=False)
        self.aclient = AsyncClient(raise_request_exception=False)
        self.aheaders = {"authorization": headers["Authorization"]}  # ASGI: lower-case
        self.failures: list[str] = []
        self.statuses: dict[int, int] = {}
        self.recorded = 0
        #: The traceback of the last exception a view let out (Django's
        #: ``got_request_exception``), shown with a 5xx so a rare one explains itself.
        self.last_exception = ""

    def on_exception(self, sender: Any, **kwargs: Any) -> None:
        self.last_exception = traceback.format_exc()

    def send(
        self, method: str, path: str, body: bytes | None = None, asgi: bool = False
    ) -> Outcome:
        """One request through Django's WSGI handler, or (``asgi``) its ASGI handler on a
        fresh event loop, the answer read to its end."""
        if asgi:
            return async_to_sync(self._asend)(method, path, body)
        if method == "GET":
            response = self.client.get(path)  # the query is in the path, percent-encoded
        else:
            response = self.client.generic(method, path, body or b"", "application/json")
        if getattr(response, "streaming", False):
            try:
                content = b"".join(response.streaming_content)
            except Exception as exc:  # the stream broke off: a server error mid-answer
                return Outcome(599, response.headers.get("X-Request-ID"), f"stream: {exc!r}")
            finally:
                response.close()
            return self._outcome(response, content)
        return self._outcome(response, response.content)

    async def _asend(self, method: str, path: str, body: bytes | None) -> Outcome:
        if method == "GET":
            response = await self.aclient.get(path, headers=self.aheaders)
        else:
            response = await self.aclient.generic(
                method, path, body or b"", "application/json", headers=self.aheaders
            )
        if getattr(response, "streaming", False):
            try:
                content = b"".join([bytes(part) async for part in response.streaming_content])
            except Exception as exc:
                return Outcome(599, response.headers.get("X-Request-ID"), f"stream: {exc!r}")
            return self._outcome(response, content)
        return self._outcome(response, response.content)

    @staticmethod
    def _outcome(response: Any, content: bytes) -> Outcome:
        request_id = response.headers.get("X-Request-ID")
        text = content.decode("utf-8", "replace")
        found = re.search(r'"request_id":\s*"([0-9a-f-]{36})"', text)
        if response.status_code < 300 and found:
            request_id = request_id or found.group(1)
        return Outcome(response.status_code, request_id, text)

    def summary(self, what: str) -> str:
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(self.statuses.items()))
        total = sum(self.statuses.values())
        return f"{what}: {total} cases ({statuses}); {self.recorded} 2xx recorded"

    def judge(self, case: int, label: str, outcome: Outcome, routes: bool) -> None:
        self.statuses[outcome.status] = self.statuses.get(outcome.status, 0) + 1
        if outcome.status >= 500:
            shown = " ".join(re.sub(r"<[^>]+>", " ", outcome.text).split())[:200]
            raised = self.last_exception[-3_000:] or "(no exception reached Django)"
            self.failures.append(f"#{case} {label}: {outcome.status} {shown}\n{raised}")
        self.last_exception = ""
        if KEY in outcome.text:
            self.failures.append(f"#{case} {label}: the provider's key is in the answer")
        if routes and 200 <= outcome.status < 300:
            rid = outcome.request_id
            if not rid or not RoutingDecision.objects.filter(request_id=rid).exists():
                self.failures.append(f"#{case} {label}: 2xx without a decision row ({rid})")
            else:
                self.recorded += 1


@pytest.fixture
def fuzzer(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fuzzer]:
    settings.LLM_ROUTING = {
        "API_THROTTLE_RATES": {"user": None, "anon": None},
        "ROUTES": {"fuzz": ["fake"]},
    }
    monkeypatch.setenv("TEST_PROVIDER_KEY", KEY)
    upstream = FakeUpstream().start()
    try:
        fake = Provider.objects.create(
            name="fake",
            kind="openai_compatible",
            model="fake-model",
            base_url=f"{upstream.url}/v1",
            api_key_env="TEST_PROVIDER_KEY",
            timeout_s=5.0,
            first_token_timeout_s=5.0,
            max_retries=0,
            supports_structured_output=True,
            supports_streaming=True,
            supports_tools=True,
            supports_images=True,
        )
        chain = Chain.objects.create(name="fake-chain", is_default=True)
        ChainEntry.objects.create(chain=chain, provider=fake, position=0)
        user = get_user_model().objects.create_superuser("fuzzer", password="pw-fuzzer-123")
        made = Fuzzer(Token.objects.create(user=user).key)
        got_request_exception.connect(made.on_exception)
        try:
            yield made
        finally:
            got_request_exception.disconnect(made.on_exception)
    finally:
        clear_adapter_cache()
        upstream.stop()


def _share(operation: str) -> int:
    return max(1, round(CASES * SHARE[operation]))


def _body_cases(
    fuzzer: Fuzzer,
    operation: str,
    path: str,
    bases: Callable[[str], list[dict[str, Any]]],
    routes: bool = True,
) -> None:
    rng = random.Random(f"{SEED}:{operation}")
    templates = [*bases("mock"), *bases("fake")]
    for case in range(_share(operation)):
        base = templates[case % len(templates)]
        if rng.random() < 0.03:  # the body is not UTF-8 at all
            planted, raw = Planted("invalid UTF-8", "(body)", {}), json.dumps(base).encode()
            raw = raw[:-1] + b'"\xed\xa0\x80"}' if raw.endswith(b"}") else raw + b"\xff"
        else:
            body, planted = plant(base, rng)
            raw = encode(body, planted)
        asgi = case % 4 == 3  # a quarter of the cases through the ASGI handler
        outcome = fuzzer.send("POST", path, raw, asgi=asgi)
        label = f"{operation} {'ASGI' if asgi else 'WSGI'} {planted.place} [{planted.kind}]"
        fuzzer.judge(case, label, outcome, routes=routes)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("operation", list(BODY_OPERATIONS))
def test_hostile_bodies_never_5xx_and_every_2xx_is_recorded(fuzzer: Fuzzer, operation: str):
    path = operation.split()[1]
    bases, routes = BODY_OPERATIONS[operation]
    _body_cases(fuzzer, operation, path, bases, routes)
    print(fuzzer.summary(operation))  # shown with -s
    assert not fuzzer.failures, "\n".join(fuzzer.failures[:20])
    if routes:
        assert fuzzer.recorded > 0  # some answers were 2xx and each had its row
    else:
        assert fuzzer.statuses.get(200, 0) > 0  # some were answered


QUERY_HOSTILE = [
    ("nul", lambda v, r: _insert(v, "\x00", r)),
    ("invalid UTF-8 escape", lambda v, r: v + "\udcff"),  # what a %ED%A0%80 byte decodes to
    ("long", lambda v, r: v * 2_000),
    ("huge integer", lambda v, r: "9" * 5_000),
    ("json NaN", lambda v, r: '{"type": "number", "maximum": NaN}'),
    ("json Infinity", lambda v, r: '{"type": "number", "maximum": 1e400}'),
    ("json surrogate", lambda v, r: '{"type": "string", "description": "\\ud800"}'),
    ("json deep 1500", lambda v, r: "[" * 1_500 + "]" * 1_500),
    ("json deep 50000", lambda v, r: '{"a": ' * 50_000 + "1" + "}" * 50_000),
    (
        "json nested properties 100",
        lambda v, r: '{"type": "object", "properties": {"a": ' * 100 + "{}" + "}}" * 100,
    ),
    ("json big int", lambda v, r: '{"type": "integer", "maximum": ' + str(10**40) + "}"),
    ("benign", lambda v, r: _insert(v, r.choice(BENIGN), r)),
]
EXPLAIN_QUERY = {
    "task": "summarize",
    "route": "fuzz",
    "provider": "fake",
    "chain": "fake-chain",
    "stream": "true",
    "schema": json.dumps(SCHEMA),
}


@pytest.mark.django_db(transaction=True)
def test_hostile_queries_and_paths_never_5xx(fuzzer: Fuzzer):
    operation = "GET /audit/explain/"
    rng = random.Random(f"{SEED}:{operation}")
    for case in range(_share(operation)):
        query = {k: v for k, v in EXPLAIN_QUERY.items() if rng.random() < 0.7 or k == "task"}
        if "provider" in query and rng.random() < 0.5:
            query.pop("provider")  # provider and force_provider exclude each other
            query["force_provider"] = "mock"
        name = rng.choice(list(query))
        kind, hostile = rng.choice(QUERY_HOSTILE)
        query[name] = hostile(query[name], rng)
        encoded = "&".join(f"{k}={_quote(v)}" for k, v in query.items())
        outcome = fuzzer.send("GET", f"/audit/explain/?{encoded}")
        fuzzer.judge(case, f"{operation} {name} [{kind}]", outcome, routes=False)
    for operation, make in [
        ("GET /audit/jobs/{job_id}/", lambda v: f"/audit/jobs/{v}/"),
        ("GET /health/", lambda v: f"/health/?x={v}"),
        ("GET /v1/models", lambda v: f"/v1/models?x={v}"),
    ]:
        rng = random.Random(f"{SEED}:{operation}")
        for case in range(_share(operation)):
            kind, hostile = rng.choice(QUERY_HOSTILE)
            value = hostile("7d3c9a1e-0b2f-4c5d-8e6f-123456789abc", rng)
            outcome = fuzzer.send("GET", make(_quote(value)))
            fuzzer.judge(case, f"{operation} [{kind}]", outcome, routes=False)
    print(fuzzer.summary("GET operations"))  # shown with -s
    assert not fuzzer.failures, "\n".join(fuzzer.failures[:20])


def _quote(text: str) -> str:
    """Percent-encoded; a lone surrogate as its (invalid) UTF-8 bytes, as a client may."""
    raw = text.encode("utf-8", "surrogatepass")
    return "".join(
        chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "-_.~") else f"%{b:02X}"
        for b in raw
    )
