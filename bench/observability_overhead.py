#!/usr/bin/env python3
"""What metrics and tracing add to one routed request (issue 15: at most 0.2 ms).

    .venv/bin/python bench/observability_overhead.py            # print a Markdown table
    .venv/bin/python bench/observability_overhead.py --write    # also update docs/benchmarks.md

Two measurements, each in interleaved rounds (shuffled order) so machine noise hits all
variants alike; one sample is the mean over a batch of requests:

* **receivers** — the per-request work itself, on a realistic RoutingResult (a 503
  attempt, a skip, a served attempt with tokens): nothing (``off``), the metrics
  receiver (``metrics``), the four tracing receivers writing three spans to an SDK
  tracer provider with a span processor that drops them (``tracing``), and both.
  The cost computation is shared with the recorder (which runs either way) and so is
  warm here, as it is in a real request.
* **route()** — end to end through the router with the mock backstop only (no HTTP,
  ``persist=False``, rows read from in-memory SQLite): metrics and tracing off vs on.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ["DATABASE_URL"] = "sqlite://:memory:"

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider  # noqa: E402

from bench.common import interleaved_samples, replace_docs_section  # noqa: E402
from llm_routing import metrics, pricing, tracing  # noqa: E402
from llm_routing.conf import routing_settings  # noqa: E402
from llm_routing.models import Provider  # noqa: E402
from llm_routing.router import route  # noqa: E402
from llm_routing.types import (  # noqa: E402
    AttemptRecord,
    AuditRequest,
    ProviderResult,
    RoutingMetadata,
    RoutingResult,
    Usage,
)

BEGIN = "<!-- observability-overhead:begin -->"
END = "<!-- observability-overhead:end -->"
REQUEST = AuditRequest(task="summarize", input_text="Some input text.")


class _Drop(SpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        return None


def routed_result() -> RoutingResult:
    request_id = str(uuid.uuid4())
    attempts = (
        AttemptRecord(0, "oa", "gpt-4o-mini", "error", "unavailable", "unavailable", 503,
                      True, 2, 120.0, usage=Usage()),
        AttemptRecord(1, "dis", "gpt-4o", "skipped", "disabled"),
        AttemptRecord(2, "an", "claude-3-5-haiku-latest-fake", "ok", served=True,
                      latency_ms=300.0, usage=Usage(12, 8)),
    )  # fmt: skip
    result = ProviderResult(
        provider="an", model="claude-3-5-haiku-latest-fake", mode="live", status="ok",
        usage=Usage(12, 8), latency_ms=300.0,
    )  # fmt: skip
    meta = RoutingMetadata(
        request_id, "default", None, None, "default", None, "an", ("oa", "dis", "an"),
        attempts, True, "unavailable",
    )  # fmt: skip
    return RoutingResult(request_id, result, meta, total_latency_ms=430.0)


def batch(fn: Callable[[], object], size: int) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        for _ in range(size):
            fn()
        return (time.perf_counter() - started) * 1000 / size

    return run


def table(samples: dict[str, list[float]], base: str) -> list[str]:
    floor = statistics.median(samples[base])
    out = ["| variant | median ms | p95 ms | added vs off (median) |", "|---|---:|---:|---:|"]
    for name, values in samples.items():
        values.sort()
        median = statistics.median(values)
        p95 = values[int(len(values) * 0.95) - 1]
        added = "—" if name == base else f"{median - floor:+.4f} ms"
        out.append(f"| {name} | {median:.4f} | {p95:.4f} | {added} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()

    logging.getLogger("llm_routing").setLevel(logging.WARNING)
    call_command("migrate", verbosity=0)
    for name, kind, model, enabled in [
        ("oa", "openai", "gpt-4o-mini", True),
        ("dis", "openai", "gpt-4o", False),
        ("an", "anthropic", "claude-3-5-haiku-latest", True),
    ]:
        Provider.objects.create(name=name, kind=kind, model=model, enabled=enabled)
    provider = TracerProvider()
    provider.add_span_processor(_Drop())
    trace.set_tracer_provider(provider)
    assert tracing.enabled()

    def traced(routed: RoutingResult) -> None:
        rid = routed.request_id
        for name, model in (("oa", "gpt-4o-mini"), ("an", "claude-3-5-haiku-latest")):
            tracing._on_call(None, request_id=rid, provider=name, model=model)
            tracing._on_result(None, request_id=rid, provider=name, result=routed.result)
        tracing._on_fallback(None, request_id=rid, provider="dis", reason="disabled")
        tracing._on_routed(None, request=REQUEST, routed=routed)

    def fresh() -> RoutingResult:
        routed = routed_result()
        pricing.costs(routed)  # the recorder's, which runs whatever is switched on
        return routed

    def metrics_only() -> None:
        metrics.observe(REQUEST, fresh())

    def both() -> None:
        routed = fresh()
        metrics.observe(REQUEST, routed)
        traced(routed)

    receivers = interleaved_samples(
        {
            "off": batch(fresh, args.batch),
            "metrics": batch(metrics_only, args.batch),
            "tracing": batch(lambda: traced(fresh()), args.batch),
            "metrics + tracing": batch(both, args.batch),
        },
        rounds=args.rounds,
        warmup=3,
    )

    mock_only = AuditRequest(task="summarize", input_text="x", provider="mock")

    size = args.batch // 4

    def routed(switched_on: bool) -> Callable[[], float]:
        """One batch of route() calls with everything off, or metrics and tracing on
        (switched per batch, so the switch's own cost is spread over the batch)."""

        def run() -> float:
            real = tracing.enabled
            # The cached settings value is switched directly (override_settings would
            # reload every setting and so add its own cost to the "on" batches).
            routing_settings._cache["METRICS_TOKEN"] = "bench" if switched_on else None
            if not switched_on:
                tracing.enabled = lambda: False  # type: ignore[assignment]
            try:
                return batch(lambda: route(mock_only, persist=False), size)()
            finally:
                tracing.enabled = real  # type: ignore[assignment]

        return run

    end_to_end = interleaved_samples(
        {"off": routed(False), "on": routed(True)}, rounds=args.rounds, warmup=3
    )

    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
        f"{platform.machine()} / Python {platform.python_version()}, {os.cpu_count()} CPUs "
        f"(shared with other jobs), {args.rounds} interleaved rounds; one sample is the mean "
        f"of {args.batch} requests (route(): {args.batch // 4}).",
        "",
        "Receivers, per routed request (a 503 attempt, a skip, a served attempt):",
        "",
        *table(receivers, "off"),
        "",
        "`route()` end to end (mock backstop, `persist=False`), metrics and tracing off vs on:",
        "",
        *table(end_to_end, "off"),
        "",
        "Reading: the metrics receiver stays inside the 0.2 ms budget; tracing with the "
        "OpenTelemetry SDK costs about 0.05-0.1 ms per span it writes (one per request plus "
        "one per attempt), so a request with several attempts goes over 0.2 ms once "
        "tracing is on. Cost computation is not in the receiver rows: the recorder needs it "
        "either way (cheap once a model's price is cached); with `persist=False` the "
        'end-to-end "on" rows pay it. The end-to-end rows are '
        "dominated by the database reads of the walk and by the noise of this shared "
        "machine; their difference moved by several tenths of a millisecond between runs.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        block = (
            f"{BEGIN}\n## Metrics and tracing overhead\n\nScript: "
            "`bench/observability_overhead.py` (`--write` regenerates this section).\n\n"
            f"{text}\n{END}"
        )
        replace_docs_section(ROOT / "docs" / "benchmarks.md", BEGIN, END, block)


if __name__ == "__main__":
    main()
