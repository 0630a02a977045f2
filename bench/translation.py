#!/usr/bin/env python3
"""Translation cost per adapter call, without the network: ``build_payload`` of the
request plus ``parse`` of the vendor's decoded answer, for each vendor adapter.

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

from bench.common import interleaved_samples, replace_docs_section  # noqa: E402
from llm_routing.providers.anthropic import AnthropicProvider  # noqa: E402
from llm_routing.providers.base import HttpProvider  # noqa: E402
from llm_routing.providers.gemini import GeminiProvider  # noqa: E402
from llm_routing.providers.openai import OpenAIProvider  # noqa: E402
from llm_routing.types import AuditRequest, Message, ProviderConfig, Tool  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()

    def sampler(adapter: HttpProvider, request: AuditRequest, answer: Any) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            for _ in range(args.batch):
                adapter.build_payload(request)
                adapter.parse(answer, request)
            return (time.perf_counter() - started) * 1e6 / args.batch

        return run

    samples = interleaved_samples(
        {kind: sampler(*case) for kind, case in answers().items()},
        rounds=args.rounds,
        warmup=args.warmup,
    )
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
        f"{platform.machine()} / Python {platform.python_version()}, {os.cpu_count()} CPUs "
        f"(shared), {args.rounds} interleaved rounds of {args.batch} calls after "
        f"{args.warmup} warm-up rounds.",
        "",
        "| adapter, request | median µs / call | p95 µs / call |",
        "|---|---:|---:|",
    ]
    for kind, values in samples.items():
        values.sort()
        p95 = values[int(len(values) * 0.95) - 1]
        lines.append(f"| {kind} | {statistics.median(values):.1f} | {p95:.1f} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        block = (
            f"{BEGIN}\n## Adapter translation\n\n"
            "Script: `bench/translation.py` (`--write` regenerates this section): "
            "`build_payload` + `parse` per call, no network.\n\n"
            f"{table}\n{END}"
        )
        replace_docs_section(ROOT / "docs" / "benchmarks.md", BEGIN, END, block)


if __name__ == "__main__":
    main()
