#!/usr/bin/env python3
"""Translation cost per adapter call and per face request, without the network.

Adapters: ``build_payload`` of the request plus ``parse`` of the vendor's decoded
answer, for each vendor adapter. Faces (``/v1/chat/completions``'s request parsing for
reference, ``/v1/responses``, ``/v1/messages``): the client's JSON body validated and
translated into the router's request (``face.parse``), the routed answer translated back
into the face's answer object (``face.body``), and the stream frames of a 40-chunk
answer (``face.frames``), per request. Embeddings (``/v1/embeddings``): one text and
eight texts of about 200 characters, answered with 1536-dimensional vectors — the
adapters' ``embed_payload`` + ``parse_embeddings`` (OpenAI's base64, Gemini's JSON
numbers) and the walk's check of the answer (``checked_answer``), and the face's
``parse`` and ``body`` (float and base64, from the vectors the openai adapter decoded).

    .venv/bin/python bench/translation.py            # print a Markdown table
    .venv/bin/python bench/translation.py --write    # also update docs/benchmarks.md

Two requests: the one-shot ``task + instructions + input_text`` of
``bench/adapter_overhead.py`` (answered with text), and a chat request — a system turn,
four user/assistant turns of the same total length, two tools — answered with a tool
call. The answer is the fake upstream's healthy answer to the payload (decoded once,
outside the timing). Each sample times ``--batch`` calls and is
reported per call, in microseconds; kinds are interleaved so machine noise hits all
alike.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ["DATABASE_URL"] = "sqlite://:memory:"

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from bench.common import interleaved_samples, replace_docs_section  # noqa: E402
from llm_routing.api import messages_serializers, responses_serializers  # noqa: E402
from llm_routing.api.embeddings_face import EmbeddingsFace  # noqa: E402
from llm_routing.api.faces import Face, Parsed  # noqa: E402
from llm_routing.api.messages_face import MessagesFace  # noqa: E402
from llm_routing.api.openai_compat import ChatCompletionRequestSerializer  # noqa: E402
from llm_routing.api.responses_face import ResponsesFace  # noqa: E402
from llm_routing.api.reuse import reused  # noqa: E402
from llm_routing.providers.anthropic import AnthropicProvider  # noqa: E402
from llm_routing.providers.base import HttpProvider  # noqa: E402
from llm_routing.providers.embeddings import checked_answer  # noqa: E402
from llm_routing.providers.gemini import GeminiProvider  # noqa: E402
from llm_routing.providers.openai import OpenAIProvider  # noqa: E402
from llm_routing.types import (  # noqa: E402
    AuditRequest,
    Message,
    ProviderConfig,
    ProviderResult,
    RouterStreamEvent,
    RoutingMetadata,
    RoutingResult,
    StreamChunk,
    StreamResult,
    Tool,
    ToolCall,
    Usage,
)
from tests.fakes import upstream  # noqa: E402

REQUEST = AuditRequest(
    task="summarize",
    input_text="The quick brown fox jumps over the lazy dog. " * 20,
    instructions="Summarize in one sentence.",
)
_TEXT = "The quick brown fox jumps over the lazy dog. " * 5
CHAT = AuditRequest(
    task="chat",
    instructions="Summarize in one sentence.",
    messages=tuple(
        Message(role="user" if i % 2 == 0 else "assistant", content=_TEXT) for i in range(4)
    ),
    tools=(
        Tool(
            name="get_weather",
            description="The weather in a city.",
            parameters={
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        ),
        Tool(name="get_time"),
    ),
    tool_choice="auto",
)
FACE_BEGIN = "<!-- face-translation:begin -->"
FACE_END = "<!-- face-translation:end -->"
BEGIN = "<!-- adapter-translation:begin -->"
END = "<!-- adapter-translation:end -->"


def answers() -> dict[str, tuple[HttpProvider, AuditRequest, Any]]:
    out: dict[str, tuple[HttpProvider, AuditRequest, Any]] = {}
    for kind, cls, make in (
        ("openai", OpenAIProvider, upstream._openai_ok),
        ("anthropic", AnthropicProvider, upstream._anthropic_ok),
        ("gemini", GeminiProvider, lambda body, *c: upstream._gemini_ok(body, "g", *c)),
    ):
        adapter = cls(ProviderConfig(name=f"bench-{kind}", kind=kind, model="m"))
        out[f"{kind}, one-shot"] = (adapter, REQUEST, make(adapter.build_payload(REQUEST)))
        chat = adapter.build_payload(CHAT)
        out[f"{kind}, chat + tools"] = (
            adapter,
            CHAT,
            make(chat, upstream._tool_calls(kind, chat, None)),
        )
    for adapter, request, answer in out.values():  # sanity: chat answers are tool calls
        assert bool(adapter.parse(answer, request).tool_calls) == (request is CHAT)
    return out


# --- embeddings: one text and eight, 1536-dimensional vectors ---------------------------

DIMENSIONS = 1536
EMBED_TEXTS = [f"{i}: " + _TEXT[:200] for i in range(8)]
#: The embeddings requests measured: one text (a search query), eight (a batch).
EMBEDS = {
    n: AuditRequest(
        task="embeddings", call="embed", inputs=tuple(EMBED_TEXTS[:n]), dimensions=DIMENSIONS
    )
    for n in (1, 8)
}


def embedding_answers() -> dict[str, tuple[HttpProvider, AuditRequest, Any]]:
    """(adapter, request, its vendor's decoded answer) per vendor and size: the fake
    upstream's answer to the adapter's payload."""
    out: dict[str, tuple[HttpProvider, AuditRequest, Any]] = {}
    for kind, cls in (("openai", OpenAIProvider), ("gemini", GeminiProvider)):
        config = ProviderConfig(name=f"bench-{kind}", kind=kind, model="m")
        adapter = cls(config)
        for n, request in EMBEDS.items():
            answer = upstream._embeddings_ok(kind, adapter.embed_payload(request), upstream.Fault())
            result = checked_answer(adapter.parse_embeddings(answer, request), request, config)
            assert result.ok and len(result.vectors[n - 1]) == DIMENSIONS  # sanity
            out[f"{kind}, embeddings ({n} x {DIMENSIONS})"] = (adapter, request, answer)
    return out


# --- the faces: the same chat request (a system turn, four turns, two tools) ----------

_WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
_TURNS = [{"role": "user" if i % 2 == 0 else "assistant", "content": _TEXT} for i in range(4)]
FACE_BODIES: dict[str, dict[str, Any]] = {
    "chat.completions": {
        "model": "mock",
        "messages": [{"role": "system", "content": "Summarize in one sentence."}, *_TURNS],
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "parameters": _WEATHER}},
            {"type": "function", "function": {"name": "get_time"}},
        ],
        "tool_choice": "auto",
    },
    "responses": {
        "model": "mock",
        "instructions": "Summarize in one sentence.",
        "input": _TURNS,
        "tools": [
            {"type": "function", "name": "get_weather", "parameters": _WEATHER},
            {"type": "function", "name": "get_time"},
        ],
        "tool_choice": "auto",
    },
    "messages": {
        "model": "mock",
        "max_tokens": 512,
        "system": "Summarize in one sentence.",
        "messages": _TURNS,
        "tools": [
            {"name": "get_weather", "input_schema": _WEATHER},
            {"name": "get_time", "input_schema": {"type": "object"}},
        ],
        "tool_choice": {"type": "auto"},
    },
}
_ROUTED = RoutingResult(
    request_id="0f8e1c2d-3b4a-5968-7766-554433221100",
    result=ProviderResult(
        provider="p",
        model="m",
        mode="live",
        status="ok",
        output=_TEXT,
        usage=Usage(120, 40),
        finish_reason="tool_use",
        tool_calls=(ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}'),),
    ),
    metadata=RoutingMetadata(
        request_id="0f8e1c2d-3b4a-5968-7766-554433221100",
        router_mode="chain",
        route=None,
        rule=None,
        chain_name="default",
        requested_provider=None,
        selected_provider="p",
        chain=("p",),
        attempts=(),
        fallback_used=False,
        fallback_reason=None,
    ),
)
_STREAM = [StreamChunk(text=w + " ", provider="p", model="m") for w in (_TEXT.split() * 4)[:40]]
_EVENTS: list[RouterStreamEvent] = [*_STREAM, StreamResult(_ROUTED)]


def _chat_parse(body: dict[str, Any]) -> AuditRequest:
    with reused(ChatCompletionRequestSerializer, body) as serializer:
        serializer.is_valid(raise_exception=True)
        return serializer.to_request()


def _messages_to_chat(body: dict[str, Any]) -> int:
    chat: list[dict[str, Any]] = []
    places: list[str] = []
    for i, turn in enumerate(body["messages"]):
        messages_serializers._turn(turn, i, chat, places)
    return len(chat)


def _responses_to_chat(body: dict[str, Any]) -> int:
    return len(responses_serializers._items(body["input"])[0])


#: The face's own step alone: its turns into the chat shapes the shared checks take.
TRANSLATE: dict[str, Callable[[dict[str, Any]], int]] = {
    "messages": _messages_to_chat,
    "responses": _responses_to_chat,
}


def _frames(face: Face, parsed: Parsed) -> int:
    frames = face.frames(_ROUTED.request_id, parsed)
    return sum(len(frames(event)) for event in _EVENTS)


def face_cases() -> dict[str, Callable[[], Any]]:
    """Per face: parse (request), body (whole answer), frames (a 40-chunk stream)."""
    call_command("migrate", verbosity=0)  # the config snapshot reads its tables
    faces: dict[str, Face] = {"responses": ResponsesFace(), "messages": MessagesFace()}
    chat = FACE_BODIES["chat.completions"]
    bare = {k: v for k, v in chat.items() if k not in ("tools", "tool_choice")}
    cases: dict[str, Callable[[], Any]] = {
        "chat.completions, parse": lambda: _chat_parse(bare),
        "chat.completions, parse with 2 tools": lambda: _chat_parse(chat),
    }
    embeddings = EmbeddingsFace()
    answers = embedding_answers()
    for n in EMBEDS:
        # The vectors as the openai adapter hands them on (decoded base64: float32 arrays).
        adapter, request, answer = answers[f"openai, embeddings ({n} x {DIMENSIONS})"]
        vectors = adapter.parse_embeddings(answer, request).vectors
        routed = RoutingResult(
            request_id=_ROUTED.request_id,
            result=ProviderResult(
                provider="p", model="m", mode="live", status="ok", vectors=vectors, usage=Usage(50)
            ),
            metadata=_ROUTED.metadata,
        )
        body = {"model": "mock", "input": EMBED_TEXTS[:n]}
        as_float = embeddings.parse(body)
        as_base64 = embeddings.parse({**body, "encoding_format": "base64"})
        assert len(embeddings.body(routed, as_base64)["data"]) == n  # sanity
        size = f"{n} x {DIMENSIONS}"
        cases[f"embeddings ({size}), parse"] = functools.partial(embeddings.parse, body)
        cases[f"embeddings ({size}), body (float)"] = functools.partial(
            embeddings.body, routed, as_float
        )
        cases[f"embeddings ({size}), body (base64)"] = functools.partial(
            embeddings.body, routed, as_base64
        )
    for name, face in faces.items():
        body = FACE_BODIES[name]
        without = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
        parsed: Parsed = face.parse(body)  # sanity: valid, and a whole answer shapes
        assert len(parsed.request.tools) == 2 and face.body(_ROUTED, parsed)

        stream = functools.partial(_frames, face, parsed)
        cases[f"{name}, translate"] = functools.partial(TRANSLATE[name], body)
        cases[f"{name}, parse"] = functools.partial(face.parse, without)
        cases[f"{name}, parse with 2 tools"] = functools.partial(face.parse, body)
        cases[f"{name}, body"] = functools.partial(face.body, _ROUTED, parsed)
        cases[f"{name}, stream of 40 chunks"] = stream
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--faces-only", action="store_true", help="skip the adapters")
    args = parser.parse_args()

    def sampler(adapter: HttpProvider, request: AuditRequest, answer: Any) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            for _ in range(args.batch):
                adapter.build_payload(request)
                adapter.parse(answer, request)
            return (time.perf_counter() - started) * 1e6 / args.batch

        return run

    def face_sampler(case: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            for _ in range(args.batch):
                case()
            return (time.perf_counter() - started) * 1e6 / args.batch

        return run

    face_samples = interleaved_samples(
        {name: face_sampler(case) for name, case in face_cases().items()},
        rounds=args.rounds,
        warmup=args.warmup,
    )
    face_table = _table(face_samples, args, "face, step") + "\n\n" + _overhead(face_samples)
    print(face_table)
    if args.write:
        replace_docs_section(
            ROOT / "docs" / "benchmarks.md",
            FACE_BEGIN,
            FACE_END,
            f"{FACE_BEGIN}\n## Face translation\n\n"
            "Script: `bench/translation.py` (`--write` regenerates this section and the "
            "next; `--faces-only` this one). Per request, no network: `parse` is the "
            "client's JSON body validated and translated into the router's request (the "
            "same chat request on each face: a system turn, four turns, two tools), "
            "`body` the routed answer (text and a tool call) translated into the face's "
            "answer object, `stream of 40 chunks` every SSE frame of a 40-chunk answer "
            "and its end, `translate` the face's own step alone (its turns into the chat "
            "shapes that every face's shared checks then validate). Target: under 100 µs "
            "per request per face for the translation (`translate + body` below); `parse` "
            "is mostly the checks every face shares with `/v1/chat/completions` (the "
            "difference to chat's is noise).\n\n"
            f"{face_table}\n{FACE_END}",
        )
    if args.faces_only:
        return
    samples = interleaved_samples(
        {kind: sampler(*case) for kind, case in answers().items()},
        rounds=args.rounds,
        warmup=args.warmup,
    )

    def embed_sampler(
        adapter: HttpProvider, request: AuditRequest, answer: Any
    ) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            for _ in range(args.batch):
                adapter.embed_payload(request)
                result = adapter.parse_embeddings(answer, request)
                checked_answer(result, request, adapter.config)
            return (time.perf_counter() - started) * 1e6 / args.batch

        return run

    samples.update(
        interleaved_samples(
            {kind: embed_sampler(*case) for kind, case in embedding_answers().items()},
            rounds=args.rounds,
            warmup=args.warmup,
        )
    )
    table = _table(samples, args, "adapter, request")
    print(table)
    if args.write:
        block = (
            f"{BEGIN}\n## Adapter translation\n\n"
            "Script: `bench/translation.py` (`--write` regenerates this section): "
            "`build_payload` + `parse` per call, no network; for embeddings "
            "`embed_payload` + `parse_embeddings` + the walk's `checked_answer` of one "
            "and of eight 1536-dimensional vectors (OpenAI's base64, Gemini's JSON "
            "numbers).\n\n"
            f"{table}\n{END}"
        )
        replace_docs_section(ROOT / "docs" / "benchmarks.md", BEGIN, END, block)


def _overhead(samples: dict[str, list[float]]) -> str:
    """Each face's translation over chat's own parsing: its parse minus chat's (the same
    checks run on both), plus its answer object, plus a stream chunk's frames."""
    median = {name: statistics.median(values) for name, values in samples.items()}
    lines = [
        "| face | parse over chat's | with 2 tools | translate + body | per stream chunk |",
        "|---|---:|---:|---:|---:|",
    ]
    for face in ("responses", "messages"):
        extra = median[f"{face}, parse"] - median["chat.completions, parse"]
        extra_tools = (
            median[f"{face}, parse with 2 tools"] - median["chat.completions, parse with 2 tools"]
        )
        chunk = median[f"{face}, stream of 40 chunks"] / (len(_STREAM) + 1)
        total = median[f"{face}, translate"] + median[f"{face}, body"]
        lines.append(f"| {face} | {extra:+.1f} | {extra_tools:+.1f} | {total:.1f} | {chunk:.1f} |")
    return "\n".join(lines)


def _table(samples: dict[str, list[float]], args: argparse.Namespace, what: str) -> str:
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
        f"{platform.machine()} / Python {platform.python_version()}, {os.cpu_count()} CPUs "
        f"(shared), {args.rounds} interleaved rounds of {args.batch} calls after "
        f"{args.warmup} warm-up rounds.",
        "",
        f"| {what} | median µs / call | p95 µs / call |",
        "|---|---:|---:|",
    ]
    for kind, values in samples.items():
        values.sort()
        p95 = values[int(len(values) * 0.95) - 1]
        lines.append(f"| {kind} | {statistics.median(values):.1f} | {p95:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
