"""Benchmark: the step strategies' figures (docs/strategies.md), in process, on offline
providers (``mode = "mock"``: no network), each routed request a real walk.

    .venv/bin/python bench/strategies.py [--requests 10000] [--workers 2]
                                         [--conversations 500] [--clients 64]
                                         [--hedge-requests 2000] [--only hedging]

* **weighted** — a 70/20/10 step; ``--requests`` requests split over ``--workers``
  processes (each its own request ids); the share each candidate served.
* **affinity** — ``--conversations`` conversations x 4 turns on a 2-candidate weighted
  step, each turn with its conversation's affinity key: the share of turns 2-4 served
  where turn 1 was; then the circuit of one candidate is opened and the share of its
  conversations that moved.
* **least_in_flight** — ``--clients`` concurrent clients on the event loop
  (``aroute``) over two candidates, one 5x slower (an adapter that sleeps 5 ms or 25 ms):
  the average calls in flight at each adapter, sampled, against the fair share (half
  of the clients): the slow one may hold at most 1.5x its fair share.
* **hedging** — ``--hedge-requests`` requests from ``--clients`` concurrent clients on
  the event loop over a chain of two: a primary that answers in 200 ms for 95 % of
  calls and 8 s for 5 %, a second candidate at 300 ms (adapters that sleep). The p99
  end-to-end latency unhedged and with ``hedge_after_ms = 400`` (target: at most 1/5),
  upstream calls per request (target: at most 1.10), and every loser cancelled (its
  sleep interrupted) and recorded as ``hedge_lost``.

Prints a Markdown table. SQLite in memory, a LocMem cache sized for every conversation
(``--redis-url``: Redis) — one process per worker: the weighted split needs no shared
state; the in-flight counts here are one process's.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    os.environ["DATABASE_URL"] = "sqlite://:memory:"
    # LocMem's default MAX_ENTRIES (300) would cull affinity keys: the bench remembers
    # every conversation, as Redis would (or --redis-url: the routing cache on Redis).
    os.environ.setdefault("CACHE_URL", "locmemcache://bench-strategies?MAX_ENTRIES=1000000")
    import django

    django.setup()
    logging.disable(logging.CRITICAL)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _chain(
    name: str, strategy: str, members: list[tuple[str, float]], kind: str = "openai"
) -> None:
    from llm_routing.models import Chain, ChainEntry, Provider

    chain = Chain.objects.create(name=name)
    for position, (provider, weight) in enumerate(members):
        row, _ = Provider.objects.get_or_create(
            name=provider, defaults={"kind": kind, "model": provider, "mode": "mock"}
        )
        ChainEntry.objects.create(
            chain=chain, provider=row, position=position, step=0, weight=weight, strategy=strategy
        )


def _weighted_worker(args: tuple[int, int]) -> Counter[str]:
    _worker, requests = args
    _setup()
    from llm_routing.router import route
    from llm_routing.types import AuditRequest

    _chain("split", "weighted", [("w70", 70), ("w20", 20), ("w10", 10)])
    request = AuditRequest(task="t", input_text="x", chain="split")
    served: Counter[str] = Counter()
    for _ in range(requests):
        served[route(request, persist=False).result.provider] += 1
    return served


def weighted(requests: int, workers: int) -> list[str]:
    with multiprocessing.Pool(workers) as pool:
        parts = pool.map(_weighted_worker, [(w, requests // workers) for w in range(workers)])
    total: Counter[str] = sum(parts, Counter())
    n = sum(total.values())
    rows = []
    for name, target in (("w70", 70.0), ("w20", 20.0), ("w10", 10.0)):
        share = 100.0 * total[name] / n
        rows.append(
            f"| weighted 70/20/10, {n} requests over {workers} workers | {name} | "
            f"{share:.2f} % (target {target:.0f} +/- 1.5) | "
            f"{'yes' if abs(share - target) <= 1.5 else 'NO'} |"
        )
    return rows


def affinity(conversations: int) -> list[str]:
    from llm_routing.models import Provider
    from llm_routing.resilience import breaker
    from llm_routing.router import route
    from llm_routing.types import AuditRequest

    _chain("sticky", "weighted", [("s1", 1), ("s2", 1)], kind="openai_compatible")
    Provider.objects.filter(name__in=["s1", "s2"]).update(
        mode="live", base_url="http://127.0.0.1:9/v1"
    )
    # Live rows need an upstream: the bench's own adapter answers in process.
    Provider.objects.filter(name__in=["s1", "s2"]).update(kind="bench_instant")
    home: dict[str, str] = {}
    kept = total = 0
    for turn in range(4):
        for c in range(conversations):
            request = AuditRequest(task="t", input_text="x", chain="sticky", affinity=f"c{c}")
            served = route(request, persist=False).result.provider
            if turn == 0:
                home[f"c{c}"] = served
            else:
                total += 1
                kept += served == home[f"c{c}"]
    down = Provider.objects.get(name="s1").to_config()
    breaker.store.force_open(down.name, down.model, 600.0)
    moved = on_down = 0
    for c, served in home.items():
        if served != "s1":
            continue
        on_down += 1
        request = AuditRequest(task="t", input_text="x", chain="sticky", affinity=c)
        moved += route(request, persist=False).result.provider == "s2"
    kept_share = 100.0 * kept / max(total, 1)
    moved_share = 100.0 * moved / max(on_down, 1)
    return [
        f"| affinity, {conversations} conversations x 4 turns | turns 2-4 where turn 1 was | "
        f"{kept_share:.2f} % (target >= 99) | {'yes' if kept_share >= 99 else 'NO'} |",
        f"| affinity, circuit of one candidate opened | its {on_down} conversations moved | "
        f"{moved_share:.1f} % (target 100) | {'yes' if moved_share == 100 else 'NO'} |",
    ]


async def _least_in_flight(clients: int, seconds: float) -> tuple[float, float, int]:
    from llm_routing.router import aroute
    from llm_routing.types import AuditRequest

    request = AuditRequest(task="t", input_text="x", chain="busy")
    stop = asyncio.get_running_loop().time() + seconds
    served: Counter[str] = Counter()

    async def client() -> None:
        while asyncio.get_running_loop().time() < stop:
            served[(await aroute(request, persist=False)).result.provider] += 1

    samples: list[tuple[int, int]] = []

    async def sampler() -> None:
        while asyncio.get_running_loop().time() < stop:
            samples.append((SleepyProvider.in_flight["fast"], SleepyProvider.in_flight["slow"]))
            await asyncio.sleep(0.005)

    await asyncio.gather(sampler(), *(client() for _ in range(clients)))
    fast = sum(s[0] for s in samples) / len(samples)
    slow = sum(s[1] for s in samples) / len(samples)
    return fast, slow, sum(served.values())


def least_in_flight(clients: int, seconds: float) -> list[str]:
    from asgiref.sync import async_to_sync

    from llm_routing.models import Provider

    _chain("busy", "least_in_flight", [("fast", 1), ("slow", 1)])
    Provider.objects.filter(name__in=["fast", "slow"]).update(mode="live", kind="bench_sleepy")
    from llm_routing import snapshot

    snapshot.current()  # built here, outside the loop
    fast, slow, n = async_to_sync(_least_in_flight)(clients, seconds)
    fair = clients / 2  # each candidate's fair share of the requests in flight
    ratio = slow / fair
    return [
        f"| least_in_flight, {clients} clients, one candidate 5x slower ({n} requests) | "
        f"calls in flight: fast {fast:.1f}, slow {slow:.1f} (fair share {fair:.0f}) | "
        f"slow / fair share = {ratio:.2f} (target <= 1.5) | {'yes' if ratio <= 1.5 else 'NO'} |"
    ]


async def _hedging(requests: int, clients: int, chain: str) -> tuple[list[float], int]:
    """End-to-end latencies (s) and the ``hedge_lost`` attempts recorded."""
    from llm_routing.router import aroute
    from llm_routing.types import AuditRequest

    loop = asyncio.get_running_loop()
    todo = iter(range(requests))
    latencies: list[float] = []
    lost = 0

    async def client() -> None:
        nonlocal lost
        for i in todo:
            request = AuditRequest(task="t", input_text=f"slow {i}" if i % 20 == 0 else "x",
                                   chain=chain)  # fmt: skip
            start = loop.time()
            routed = await aroute(request, persist=False)
            latencies.append(loop.time() - start)
            assert routed.result.ok, routed.result.error
            lost += sum(a.outcome == "hedge_lost" for a in routed.metadata.attempts)

    await asyncio.gather(*(client() for _ in range(clients)))
    return sorted(latencies), lost


def hedging(requests: int, clients: int) -> list[str]:
    from asgiref.sync import async_to_sync

    from llm_routing import snapshot
    from llm_routing.models import Chain, ChainEntry, Provider

    providers = [
        Provider.objects.create(name=name, kind="bench_tail", model=name)
        for name in ("tail", "steady")
    ]
    for chain, hedge in (("unhedged", ""), ("hedged", "400")):
        row = Chain.objects.create(name=chain, hedge_after_ms=hedge)
        for position, provider in enumerate(providers):
            ChainEntry.objects.create(chain=row, provider=provider, position=position)
    snapshot.current()
    out = []
    for chain in ("unhedged", "hedged"):
        TailProvider.calls.clear()
        TailProvider.cancelled = 0
        latencies, lost = async_to_sync(_hedging)(requests, clients, chain)
        p99 = latencies[max(0, int(0.99 * len(latencies)) - 1)]
        calls = sum(TailProvider.calls.values())
        out.append((chain, p99, calls / requests, lost, TailProvider.cancelled))
    (_, p99_plain, _, _, _), (_, p99_hedged, per_request, lost, cancelled) = out
    ok = p99_hedged <= p99_plain / 5 and per_request <= 1.10 and lost == cancelled
    return [
        f"| hedging, {requests} requests, {clients} clients, primary 200 ms (95 %) / 8 s "
        f"(5 %), second 300 ms, hedge_after_ms = 400 | p99 unhedged {p99_plain:.2f} s, "
        f"hedged {p99_hedged:.2f} s; upstream calls per request {per_request:.3f}; losers "
        f"cancelled {cancelled}, recorded hedge_lost {lost} | p99 hedged / unhedged = "
        f"{p99_hedged / p99_plain:.2f} (target <= 0.20), calls per request <= 1.10 | "
        f"{'yes' if ok else 'NO'} |"
    ]


def _register() -> None:
    from llm_routing.providers import registry
    from llm_routing.providers.base import BaseProvider
    from llm_routing.types import ProviderResult, Usage

    class InstantProvider(BaseProvider):
        kind: ClassVar[str] = "bench_instant"
        requires_key: ClassVar[bool] = False

        def complete(self, request: Any, *, api_key: Any, timeout: float) -> ProviderResult:
            return ProviderResult(
                provider=self.config.name, model=self.config.model, mode="live",
                status="ok", output="ok", usage=Usage(1, 1),
            )  # fmt: skip

    global SleepyProvider

    class SleepyProvider(InstantProvider):
        kind: ClassVar[str] = "bench_sleepy"
        in_flight: ClassVar[Counter[str]] = Counter()

        async def acomplete(self, request: Any, *, api_key: Any, timeout: float) -> Any:
            name = self.config.name
            SleepyProvider.in_flight[name] += 1
            try:
                await asyncio.sleep(0.025 if name == "slow" else 0.005)
            finally:
                SleepyProvider.in_flight[name] -= 1
            return self.complete(request, api_key=api_key, timeout=timeout)

    global TailProvider

    class TailProvider(InstantProvider):
        """``tail``: 200 ms, or 8 s for an input starting "slow" (5 % of the bench's
        requests); ``steady``: 300 ms. Counts calls and cancellations."""

        kind: ClassVar[str] = "bench_tail"
        calls: ClassVar[Counter[str]] = Counter()
        cancelled: ClassVar[int] = 0

        async def acomplete(self, request: Any, *, api_key: Any, timeout: float) -> Any:
            name = self.config.name
            TailProvider.calls[name] += 1
            if name == "steady":
                delay = 0.3
            else:
                delay = 8.0 if request.input_text.startswith("slow") else 0.2
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                TailProvider.cancelled += 1
                raise
            return self.complete(request, api_key=api_key, timeout=timeout)

    registry.register("bench_instant", InstantProvider)
    registry.register("bench_sleepy", SleepyProvider)
    registry.register("bench_tail", TailProvider)


SleepyProvider: Any = None
TailProvider: Any = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--hedge-requests", type=int, default=2000)
    parser.add_argument("--hedge-clients", type=int, default=200)
    parser.add_argument("--only", choices=["weighted", "affinity", "least_in_flight", "hedging"])
    parser.add_argument("--redis-url", help="the routing cache on this Redis (else LocMem)")
    args = parser.parse_args()
    if args.redis_url:
        os.environ["CACHE_URL"] = args.redis_url
    wanted = {args.only} if args.only else {"weighted", "affinity", "least_in_flight", "hedging"}
    rows = weighted(args.requests, args.workers) if "weighted" in wanted else []
    _setup()
    from django.core.cache import caches

    caches["default"].clear()  # no circuit or affinity left by an earlier run
    _register()
    if "affinity" in wanted:
        rows += affinity(args.conversations)
    if "least_in_flight" in wanted:
        rows += least_in_flight(args.clients, args.seconds)
    if "hedging" in wanted:
        rows += hedging(args.hedge_requests, args.hedge_clients)
    print(f"load average {os.getloadavg()[0]:.1f}, run {uuid.uuid4().hex[:8]}\n")
    print("| run | measured | figure | target met |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
