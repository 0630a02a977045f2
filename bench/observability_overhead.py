#!/usr/bin/env python3
"""What metrics and tracing add to one routed request (issue 15: at most 0.2 ms).

    .venv/bin/python bench/observability_overhead.py            # print a Markdown table
    .venv/bin/python bench/observability_overhead.py --write    # also update docs/benchmarks.md

Two measurements, each in interleaved rounds (shuffled order) so machine noise hits all
variants alike, repeated ``--runs`` times; one sample is the mean over a batch of
requests, timed by the process's CPU time (``--clock cpu``, the default: on a machine
shared with other jobs the wall clock also counts the time this process waited for a
core) or by the wall clock (``--clock wall``):

* **receivers** — the per-request work itself, on a realistic RoutingResult (a 503
  attempt, a skip, a served attempt with tokens): nothing (``off``), the metrics
  receiver (``metrics``), the four tracing receivers writing three spans (and a skip
  event) to the OpenTelemetry SDK's ``TracerProvider`` (default sampler: every span
  recorded) through a ``BatchSpanProcessor`` whose exporter discards the batches
  (``tracing``), and both. The exporter's own work (an OTLP exporter encodes and
  sends each batch) runs in the processor's thread, outside the request; with
  ``--clock cpu`` (the default) that thread's CPU time is counted, but this exporter
  only drops the batches, so a real exporter's encoding is not in these figures.
  The cost computation is shared with the recorder (which runs either way) and so is
  warm here, as it is in a real request.
* **route()** — end to end through the router with the mock backstop only (no HTTP,
  ``persist=False``, rows read from in-memory SQLite): metrics and tracing off vs on.
  Both variants compute the request's costs after ``route()``, as the recorder and the
  API's answer do in a served request whatever is switched on.
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
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ["DATABASE_URL"] = "sqlite://:memory:"

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (  # noqa: E402
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

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


class _Discard(SpanExporter):
    """Counts the spans it is handed and drops them (no network here)."""

    exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        _Discard.exported += len(spans)
        return SpanExportResult.SUCCESS


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _sdk_version() -> str:
    from importlib.metadata import version

    return version("opentelemetry-sdk")


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


#: ``--clock``: the process's CPU time (every thread of it, the span processor's
#: included; what other jobs on the machine do hardly moves it) or wall time.
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def batch(fn: Callable[[], object], size: int) -> Callable[[], float]:
    def run() -> float:
        started = clock()
        for _ in range(size):
            fn()
        return (clock() - started) * 1000 / size

    return run


def table(runs: list[dict[str, list[float]]], base: str) -> list[str]:
    """One row per variant: all runs' samples pooled (median, p95), and what it added to
    ``base`` in each run (median vs median) with the median of those."""
    out = [
        "| variant | median ms | p95 ms | added vs off, each run (ms) | added, median of runs |",
        "|---|---:|---:|---|---:|",
    ]
    for name in runs[0]:
        pooled = sorted(v for run in runs for v in run[name])
        median = statistics.median(pooled)
        p95 = pooled[int(len(pooled) * 0.95) - 1]
        if name == base:
            out.append(f"| {name} | {median:.4f} | {p95:.4f} | — | — |")
            continue
        added = [statistics.median(run[name]) - statistics.median(run[base]) for run in runs]
        each = " / ".join(f"{a:+.3f}" for a in added)
        out.append(
            f"| {name} | {median:.4f} | {p95:.4f} | {each} | "
            f"**{statistics.median(added):+.4f} ms** |"
        )
    return out


def added(runs: list[dict[str, list[float]]], name: str, base: str) -> float:
    return statistics.median(
        statistics.median(run[name]) - statistics.median(run[base]) for run in runs
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--runs", type=int, default=5, help="repeat the whole measurement")
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]

    logging.getLogger("llm_routing").setLevel(logging.WARNING)
    call_command("migrate", verbosity=0)
    for name, kind, model, enabled in [
        ("oa", "openai", "gpt-4o-mini", True),
        ("dis", "openai", "gpt-4o", False),
        ("an", "anthropic", "claude-3-5-haiku-latest", True),
    ]:
        Provider.objects.create(name=name, kind=kind, model=model, enabled=enabled)
    provider = TracerProvider()
    # A queue large enough that no span is dropped: this loop writes spans faster than
    # a server does, and the export thread shares the GIL with it.
    processor = BatchSpanProcessor(_Discard(), max_queue_size=1 << 18)
    dropped = _Warnings()
    logging.getLogger("opentelemetry").addHandler(dropped)
    provider.add_span_processor(processor)
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
                return batch(lambda: pricing.costs(route(mock_only, persist=False)), size)()
            finally:
                tracing.enabled = real  # type: ignore[assignment]

        return run

    variants = {
        "off": batch(fresh, args.batch),
        "metrics": batch(metrics_only, args.batch),
        "tracing": batch(lambda: traced(fresh()), args.batch),
        "metrics + tracing": batch(both, args.batch),
    }
    receivers: list[dict[str, list[float]]] = []
    end_to_end: list[dict[str, list[float]]] = []
    loads: list[float] = [os.getloadavg()[0]]
    for run in range(args.runs):
        receivers.append(interleaved_samples(variants, rounds=args.rounds, warmup=3))
        end_to_end.append(
            interleaved_samples(
                {"off": routed(False), "on": routed(True)}, rounds=args.rounds, warmup=3
            )
        )
        loads.append(os.getloadavg()[0])
        print(
            f"run {run + 1}/{args.runs}: metrics + tracing "
            f"{added(receivers[-1:], 'metrics + tracing', 'off'):+.4f} ms, route() on "
            f"{added(end_to_end[-1:], 'on', 'off'):+.4f} ms, load {loads[-1]:.2f}",
            file=sys.stderr,
        )
    processor.force_flush()
    assert _Discard.exported > 0, "no span reached the exporter"
    assert not dropped.records, "the span processor dropped spans: raise its queue size"
    both_added = added(receivers, "metrics + tracing", "off")
    verdict = "within" if both_added <= 0.2 else "over"

    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
        f"{platform.machine()} / Python {platform.python_version()}, {os.cpu_count()} CPUs "
        "shared with other engineers' test runs (1-minute load average "
        f"{min(loads):.1f}-{max(loads):.1f} during the run); {args.runs} runs of "
        f"{args.rounds} interleaved rounds; one sample is the mean of {args.batch} requests "
        f"(route(): {args.batch // 4}), timed by "
        + ("the process's CPU time" if args.clock == "cpu" else "the wall clock")
        + ". Tracing: opentelemetry-sdk "
        f"{_sdk_version()} `TracerProvider` (default sampler, every span recorded), "
        f"`BatchSpanProcessor`, an exporter that discards ({_Discard.exported} spans "
        "exported).",
        "",
        "Receivers, per routed request (a 503 attempt, a skip, a served attempt):",
        "",
        *table(receivers, "off"),
        "",
        "`route()` end to end (mock backstop, `persist=False`, the costs computed after it "
        "in both variants), metrics and tracing off vs on:",
        "",
        *table(end_to_end, "off"),
        "",
        f"Reading: metrics and tracing together add {both_added:.3f} ms per request "
        f"(median of the runs): {verdict} the 0.2 ms target of issue 15. Most of it is "
        "the OpenTelemetry SDK itself, about 0.02 ms per span on a quiet core (three "
        "spans here: the request and two attempts, plus a skip event), so a request with "
        "more attempts costs more; a request span that the sampler drops writes no "
        "attempt span. "
        + (
            "CPU time leaves out the time this process waited for a core; the wall "
            "clock (`--clock wall`) on this shared machine adds that wait and moves by "
            "several hundredths of a millisecond between runs."
            if args.clock == "cpu"
            else "The wall clock adds the time this process waited for a core on this "
            "shared machine; `--clock cpu` (the default) leaves it out."
        ),
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
