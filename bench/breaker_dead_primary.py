"""Benchmark: sequential requests with a dead primary, circuit breaker on vs. off,
against a healthy single-provider chain.

    .venv/bin/python bench/breaker_dead_primary.py [--requests 1000] [--no-breaker 100]
                                                   [--redis redis://127.0.0.1:6379/4]

Upstreams are local HTTP servers (tests/breaker_support.py); the dead one answers 503.
Each provider keeps the default max_retries=2 and the real backoff sleeps. Requests are
routed with ``persist=False`` (routing cost only, no log rows). Prints a Markdown table;
results are kept in docs/benchmarks-breaker.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup(db: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{db}"
    os.environ.pop("CACHE_URL", None)
    os.environ["LLM_ROUTING_LOG_LEVEL"] = "ERROR"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def caches_for(redis_url: str | None) -> dict[str, Any]:
    caches: dict[str, Any] = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "circuits": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": uuid.uuid4().hex,
        },
    }
    if redis_url:
        caches["circuits"] = {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis_url,
            "KEY_PREFIX": f"llmr-bench-{uuid.uuid4().hex}",
            "OPTIONS": {"socket_connect_timeout": 1.0, "socket_timeout": 1.0},
        }
    return caches


def scenario(
    label: str, *, chain: list[str], requests: int, breaker_on: bool, redis_url: str | None
) -> dict[str, Any]:
    from django.test.utils import override_settings

    from llm_routing.models import Chain, ChainEntry, Provider
    from llm_routing.resilience import breaker
    from llm_routing.router import route
    from llm_routing.types import AuditRequest
    from tests.breaker_support import KIND, FakeUpstream, install

    install()
    routing: dict[str, Any] = {"CACHE_ALIAS": "circuits"}
    if not breaker_on:
        routing["BREAKER_FAILURE_THRESHOLD"] = 10**9
    with (
        FakeUpstream(status=503) as dead,
        FakeUpstream(status=200) as healthy,
        override_settings(CACHES=caches_for(redis_url), LLM_ROUTING=routing),
    ):
        breaker.store = breaker.CircuitStore()
        Chain.objects.all().delete()
        Provider.objects.all().delete()
        urls = {"dead": dead.url, "healthy": healthy.url}
        main = Chain.objects.create(name="bench", is_default=True)
        for position, name in enumerate(chain):
            row = Provider.objects.create(name=name, kind=KIND, model="m", base_url=urls[name])
            ChainEntry.objects.create(chain=main, provider=row, position=position)
        request = AuditRequest(task="bench", input_text="x" * 200)
        route(request, persist=False)  # warm-up (connection pools); not counted
        for name in chain:
            breaker.store.reset(name, "m")  # start from a closed circuit
        dead.hits.clear()
        healthy.hits.clear()
        latencies: list[float] = []
        served: dict[str, int] = {}
        started = time.perf_counter()
        for _ in range(requests):
            t0 = time.perf_counter()
            routed = route(request, persist=False)
            latencies.append((time.perf_counter() - t0) * 1000)
            served[routed.result.provider] = served.get(routed.result.provider, 0) + 1
        wall = time.perf_counter() - started
    latencies.sort()
    return {
        "label": label,
        "requests": requests,
        "primary_calls": dead.requests if chain[0] == "dead" else healthy.requests,
        "served": served,
        "median": statistics.median(latencies),
        "p95": latencies[int(0.95 * (len(latencies) - 1))],
        "max": latencies[-1],
        "wall": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--no-breaker", type=int, default=100, help="requests without breaker")
    parser.add_argument("--redis", default=None, help="also run with circuits in this Redis")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        setup(str(Path(tmp) / "bench.sqlite3"))
        stores: list[tuple[str, str | None]] = [("LocMem", None)]
        if args.redis:
            stores.append(("Redis", args.redis))
        rows = []
        for store_name, url in stores:
            rows.append(
                scenario(
                    f"healthy single provider ({store_name})",
                    chain=["healthy"],
                    requests=args.requests,
                    breaker_on=True,
                    redis_url=url,
                )
            )
            rows.append(
                scenario(
                    f"dead primary, breaker on ({store_name})",
                    chain=["dead", "healthy"],
                    requests=args.requests,
                    breaker_on=True,
                    redis_url=url,
                )
            )
        if args.no_breaker:
            rows.append(
                scenario(
                    "dead primary, breaker off (LocMem)",
                    chain=["dead", "healthy"],
                    requests=args.no_breaker,
                    breaker_on=False,
                    redis_url=None,
                )
            )
    print(
        "| scenario | requests | calls to primary | served by | median ms | p95 ms | "
        "max ms | wall s |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        served = ", ".join(f"{k} {v}" for k, v in sorted(r["served"].items()))
        print(
            f"| {r['label']} | {r['requests']} | {r['primary_calls']} | {served} | "
            f"{r['median']:.2f} | {r['p95']:.2f} | {r['max']:.1f} | {r['wall']:.1f} |"
        )


if __name__ == "__main__":
    main()
