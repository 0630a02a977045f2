#!/usr/bin/env python3
"""Per-call overhead of the adapter layer against a bare httpx call to the same upstream.

    .venv/bin/python bench/adapter_overhead.py            # print a Markdown table
    .venv/bin/python bench/adapter_overhead.py --write    # also update docs/benchmarks.md

Everything talks real HTTP to the fake upstream of the test suite (127.0.0.1, keep-alive,
one pooled client per variant). Variants, measured in interleaved rounds so machine
noise hits all of them alike:

* ``bare httpx``      — ``json.loads(client.post(url, json=payload).content)`` with the
                        payload the OpenAI adapter would build; the floor. (``.json()``
                        would add httpx's charset detection, which the adapter skips.)
* ``adapter``         — ``OpenAIProvider.complete()``: payload, streamed/bounded read,
                        classification hooks, normalization.
* ``retry layer``     — ``call_with_retries()`` around the adapter: key lookup from the
                        environment, budget, result bookkeeping.
* ``router``          — ``route()``: chain resolution from the database, availability,
                        signals, the retry layer, and the RoutingDecision + Attempt rows
                        (in-memory SQLite).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ["DATABASE_URL"] = "sqlite://:memory:"
os.environ["BENCH_PROVIDER_KEY"] = "sk-bench-0123456789"

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
from django.core.management import call_command  # noqa: E402

from bench.common import interleaved_samples, replace_docs_section  # noqa: E402
from llm_routing.models import Chain, ChainEntry, Provider  # noqa: E402
from llm_routing.providers.openai import OpenAIProvider  # noqa: E402
from llm_routing.resilience.budget import Budget  # noqa: E402
from llm_routing.resilience.retry import call_with_retries  # noqa: E402
from llm_routing.router import route  # noqa: E402
from llm_routing.types import AuditRequest  # noqa: E402
from tests.fakes.upstream import FakeUpstream  # noqa: E402

REQUEST = AuditRequest(
    task="summarize",
    input_text="The quick brown fox jumps over the lazy dog. " * 20,
    instructions="Summarize in one sentence.",
)
BEGIN = "<!-- adapter-overhead:begin -->"
END = "<!-- adapter-overhead:end -->"


def measure(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()

    logging.getLogger("llm_routing").setLevel(logging.WARNING)  # one INFO line per route
    call_command("migrate", verbosity=0)
    fake = FakeUpstream().start()
    base_url = f"{fake.url}/v1"
    row = Provider.objects.create(
        name="bench-openai",
        kind="openai",
        model="gpt-bench",
        base_url=base_url,
        api_key_env="BENCH_PROVIDER_KEY",
        max_retries=0,
    )
    chain = Chain.objects.create(name="bench", is_default=True)
    ChainEntry.objects.create(chain=chain, provider=row, position=0)

    adapter = OpenAIProvider(row.to_config())
    bare = httpx.Client(follow_redirects=False, timeout=10.0)
    url = adapter.endpoint(REQUEST)
    payload = adapter.build_payload(REQUEST)
    headers = {"authorization": "Bearer sk-bench-0123456789"}

    def budget() -> Budget:
        return Budget(deadline_s=60.0, max_attempts=6)

    variants: dict[str, Callable[[], object]] = {
        "bare httpx": lambda: json.loads(bare.post(url, json=payload, headers=headers).content),
        "adapter": lambda: adapter.complete(REQUEST, api_key="sk-bench-0123456789", timeout=10),
        "retry layer": lambda: call_with_retries(adapter, REQUEST, budget=budget()),
        "router": lambda: route(REQUEST),
    }
    for fn in variants.values():  # sanity: every variant really succeeds
        result = fn()
        ok = getattr(result, "ok", None)
        if ok is None and hasattr(result, "result"):
            ok = result.result.ok  # type: ignore[attr-defined]
        if ok is False:
            raise SystemExit(f"variant failed: {result!r}")
    samples = interleaved_samples(
        {name: (lambda fn=fn: measure(fn)) for name, fn in variants.items()},
        rounds=args.rounds,
        warmup=args.warmup,
    )
    fake.stop()
    bare.close()
    adapter.close()

    floor = statistics.median(samples["bare httpx"])
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
        f"{platform.machine()} / Python {platform.python_version()} / httpx {httpx.__version__}, "
        f"{os.cpu_count()} CPUs (shared), {args.rounds} interleaved rounds (shuffled order) after "
        f"{args.warmup} warm-up rounds; fake upstream on 127.0.0.1 with keep-alive.",
        "",
        "| variant | median ms | p95 ms | mean ms | overhead vs bare (median) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, values in samples.items():
        values.sort()
        median = statistics.median(values)
        p95 = values[int(len(values) * 0.95) - 1]
        mean = statistics.fmean(values)
        overhead = "—" if name == "bare httpx" else f"{median - floor:+.3f} ms"
        lines.append(f"| {name} | {median:.3f} | {p95:.3f} | {mean:.3f} | {overhead} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_docs(table)


def write_docs(table: str) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    block = (
        f"{BEGIN}\n## Adapter overhead\n\n"
        "Script: `bench/adapter_overhead.py` (`--write` regenerates this section).\n\n"
        f"{table}\n\n"
        "Reading: the adapter and the retry layer cost a few hundredths of a millisecond "
        "per call over a bare httpx POST — inside the run-to-run noise of this shared "
        "machine (repeated runs moved the adapter row between -0.07 and +0.03 ms). The "
        "router's extra ~3 ms is database work: reading the rules, the default chain and "
        "the provider rows, and writing one RoutingDecision plus its Attempt rows (SQLite "
        "in memory here). A real vendor call takes hundreds to thousands of milliseconds.\n"
        f"{END}"
    )
    replace_docs_section(path, BEGIN, END, block)


if __name__ == "__main__":
    main()
