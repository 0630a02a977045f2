#!/usr/bin/env python3
"""The hot path's per-request pieces (issue 14, item 3), before and after, on the real
PostgreSQL and Redis:

    .venv/bin/python bench/hotpath.py \\
        --database-url postgres://postgres@127.0.0.1:5432/llmr_hotpath \\
        --redis-url redis://127.0.0.1:6379/5

Prints a Markdown table of p50 microseconds per operation (interleaved rounds):

* cache GET through Django's ``caches[alias]`` (a new redis client per call) and through
  :func:`llm_routing.cache.routing_cache` (one client per process);
* a throttle check: DRF's ``UserRateThrottle`` (GET + SET of the timestamp list; with 0
  and 1,000 earlier requests in the window) and the window counter (one round trip);
* the configuration: read from the rows on every request (:func:`snapshot.build`, what
  the router did before) and the warm snapshot (:func:`snapshot.current`);
* SQL statements other than INSERTs per ``route()`` after warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/llmr_hotpath")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()

    os.environ.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=args.database_url,
        REDIS_URL=args.redis_url,
        DB_POOL="false",
    )
    import django

    django.setup()
    from django.core.cache import caches
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.throttling import UserRateThrottle

    from bench.common import interleaved_samples
    from llm_routing import snapshot
    from llm_routing.api.throttles import AuditUserThrottle
    from llm_routing.cache import routing_cache
    from llm_routing.models import Chain, ChainEntry, Provider, RoutingRule
    from llm_routing.router import route
    from llm_routing.types import AuditRequest

    call_command("migrate", verbosity=0)

    def cleanup() -> None:
        RoutingRule.objects.filter(name__startswith="bench").delete()
        Chain.objects.filter(name__startswith="bench").delete()
        Provider.objects.filter(name__startswith="bench").delete()

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    caches["default"].key_prefix = prefix
    routing_cache().key_prefix = prefix
    cleanup()
    rows = [Provider.objects.create(name=f"bench-{i}", kind="mock") for i in range(3)]
    chain = Chain.objects.create(name="bench-chain")
    for i, row in enumerate(rows):
        ChainEntry.objects.create(chain=chain, provider=row, position=i)
    RoutingRule.objects.create(name="bench-rule", task_glob="bench*", chain=chain)
    request = AuditRequest(task="bench", input_text="x")

    class Drf(UserRateThrottle):
        rate = "100000000/min"
        cache = caches["default"]

    full = Drf()
    user = SimpleNamespace(is_authenticated=True, pk=1)
    other = SimpleNamespace(is_authenticated=True, pk=2)
    for _ in range(1000):  # a window that already holds 1,000 requests
        full.allow_request(SimpleNamespace(user=other, META={}), None)

    def timed(fn: Any) -> Any:
        def run() -> float:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e6

        return run

    from django.test import override_settings

    with override_settings(LLM_ROUTING={"API_THROTTLE_RATES": {"user": "100000000/min"}}):
        ours = AuditUserThrottle()
        variants = {
            "cache GET, Django caches[alias]": timed(lambda: caches["default"].get("k")),
            "cache GET, routing_cache()": timed(lambda: routing_cache().get("k")),
            "throttle, DRF (its own growing window)": timed(
                lambda: Drf().allow_request(SimpleNamespace(user=user, META={}), None)
            ),
            "throttle, DRF (1,000 in window)": timed(
                lambda: Drf().allow_request(SimpleNamespace(user=other, META={}), None)
            ),
            "throttle, window counter": timed(
                lambda: ours.allow_request(SimpleNamespace(user=user, META={}), None)
            ),
            "config read from rows (build)": timed(snapshot.build),
            "config from the warm snapshot": timed(snapshot.current),
        }
        samples = interleaved_samples(variants, rounds=args.rounds, warmup=50)
    route(request)
    with CaptureQueriesContext(connection) as queries:
        route(request)
    statements = [
        q["sql"] for q in queries.captured_queries if not q["sql"].upper().startswith("INSERT")
    ]
    print("| operation | p50 µs | p90 µs |")
    print("|---|---:|---:|")
    for name, values in samples.items():
        values.sort()
        p90 = values[int(len(values) * 0.9)]
        print(f"| {name} | {statistics.median(values):.0f} | {p90:.0f} |")
    print(f"\nSQL statements per route() other than INSERT, after warm-up: {len(statements)}")
    for sql in statements:
        print("   ", sql[:100])
    cleanup()


if __name__ == "__main__":
    main()
