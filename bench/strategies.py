"""Benchmark: the step strategies' figures (docs/benchmarks.md, "Steps and strategies").
Every routed request is a real walk (``route()`` / ``aroute()``).

    .venv/bin/python bench/strategies.py [--requests 10000] [--workers 2]
        [--conversations 500] [--clients 64] [--seconds 10] [--fast-ms 20]
        [--hedge-requests 2000] [--hedge-clients 20] [--hedge-driver async|sync]
        [--redis-url redis://127.0.0.1:6379/14] [--database-url postgres://…]
        [--only weighted|affinity|least_in_flight|hedging]

* **weighted** — a 70/20/10 step of offline providers (``mode = "mock"``);
  ``--requests`` requests split over ``--workers`` processes (each its own request
  ids); the share each candidate served.
* **affinity** — ``--conversations`` conversations x 4 turns on a 2-candidate weighted
  step, each turn with its conversation's affinity key: the share of turns 2-4 served
  where turn 1 was; then the circuit of one candidate is opened and the share of its
  conversations that moved.
* **least_in_flight** — ``--workers`` processes, ``--clients`` clients in all (an equal
  number on each process's event loop, ``aroute``), over two candidates whose adapters
  sleep ``--fast-ms`` and 5x as long. The routing cache is Redis, so the leases are
  shared by the processes. Each process samples the calls in flight at its adapters
  every 5 ms; the sums over the processes give the slow candidate's share of the calls
  in flight and its ratio to the fair share (half; target at most 1.5x). The same run
  is then repeated with the leases kept elsewhere — a switch of this bench only,
  which makes ``llm_routing.balance`` see a routing cache that is not Redis, as a
  deployment without Redis does (everything else stays on Redis):
  ``per process`` (each process's own leases), and ``per request`` (each client its own
  leases: the counts of a deployment of single-request workers, e.g. 64 sync workers).
  Also reported: the in-flight counts the strategy read, per candidate, averaged over
  the decisions (against the calls in flight in all processes).
* **hedging** — a fake OpenAI-format upstream (aiohttp, a separate process, real
  sockets) answers model ``tail`` in 200 ms, or 8 s when the prompt says so (5 % of the
  requests), and model ``steady`` in 300 ms; it counts requests, completed answers and
  client disconnects (a request whose connection closed before its answer was sent).
  Two ``openai_compatible`` providers point at it (the key from an environment
  variable). ``--hedge-requests`` requests from ``--hedge-clients`` concurrent clients
  (``aroute``, ``persist=True``: SQLite in a temporary file, or ``--database-url``)
  over a chain of the two, unhedged, then with ``hedge_after_ms = 400``: the p99
  end-to-end latency (target: hedged at most 1/5), upstream calls per request (at most
  1.10), and the upstream's disconnects against the ``hedge_lost`` Attempt rows (they
  must match; each row is also looked up, by its request id, in what the upstream saw
  of that request), with what those rows charged. ``--database-url`` must be a
  database of the bench's own: its providers, chains and decisions are deleted first.
  ``--hedge-driver sync``: the same through ``route()`` in ``--hedge-clients`` threads
  (a WSGI deployment, the Python API): a loser's call cannot be interrupted there, so
  the upstream completes it instead of seeing a disconnect; the bench waits 9 s for
  those calls before it reads the counts.

Prints the date, the command, the load average before and after, and a Markdown table.
The routing cache is Redis (``--redis-url``; its database is flushed first: give the
bench a database of its own), except ``--redis-url ''``: LocMem (then least_in_flight
only runs the per-process modes' figures, which need no Redis; the shared mode is
skipped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import logging
import multiprocessing
import os
import re
import shlex
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_REDIS = "redis://127.0.0.1:6379/14"
#: The environment variable holding the fake upstream's key (any value).
KEY_ENV = "LLMR_BENCH_FAKE_KEY"
#: A prompt containing this makes the fake's ``tail`` model answer in 8 s.
SLOW_MARK = "bench-slow-tail"


def _setup(database_url: str = "sqlite://:memory:") -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    os.environ["DATABASE_URL"] = database_url
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


# --- weighted ---------------------------------------------------------------------------


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
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
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


# --- affinity ---------------------------------------------------------------------------


def affinity(conversations: int) -> list[str]:
    from llm_routing.models import Provider
    from llm_routing.resilience import breaker
    from llm_routing.router import route
    from llm_routing.types import AuditRequest

    _chain("sticky", "weighted", [("s1", 1), ("s2", 1)], kind="openai_compatible")
    # Live rows need an upstream: the bench's own adapter answers in process.
    Provider.objects.filter(name__in=["s1", "s2"]).update(mode="live", kind="bench_instant")
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
    for key, served in home.items():
        if served != "s1":
            continue
        on_down += 1
        request = AuditRequest(task="t", input_text="x", chain="sticky", affinity=key)
        moved += route(request, persist=False).result.provider == "s2"
    kept_share = 100.0 * kept / max(total, 1)
    moved_share = 100.0 * moved / max(on_down, 1)
    return [
        f"| affinity, {conversations} conversations x 4 turns | turns 2-4 where turn 1 was | "
        f"{kept_share:.2f} % (target >= 99) | {'yes' if kept_share >= 99 else 'NO'} |",
        f"| affinity, circuit of one candidate opened | its {on_down} conversations moved | "
        f"{moved_share:.1f} % (target 100) | {'yes' if moved_share == 100 else 'NO'} |",
    ]


# --- least_in_flight ------------------------------------------------------------------

#: Where the leases are kept: the product's (Redis: shared by every process), or this
#: bench's switch (see the module doc).
COUNTERS = ("shared", "per process", "per request")


class _LeasesPerClient:
    """``balance._local`` for the ``per request`` mode: each client (its task's context)
    its own lease table, as if each client were a worker of its own."""

    def __init__(self) -> None:
        self.table: contextvars.ContextVar[Any] = contextvars.ContextVar("bench_leases")

    def run(self, names: Any, op: str, lease: str, expires: float) -> list[int]:
        return list(self.table.get().run(names, op, lease, expires))


def _keep_leases(counters: str) -> None:
    """The bench-only switch: ``balance`` (and only it) sees a cache that is not Redis,
    so its leases are this process's (``per process``) or each client's (``per
    request``). The breaker and the snapshot stay on the routing cache."""
    if counters == "shared":
        return
    from llm_routing import balance

    balance.async_redis = lambda store: None  # type: ignore[assignment]
    balance.raw_redis = lambda store: None  # type: ignore[assignment]
    if counters == "per request":
        balance._local = _LeasesPerClient()  # type: ignore[assignment]


async def _least_in_flight(clients: int, seconds: float, counters: str) -> dict[str, Any]:
    from llm_routing import balance
    from llm_routing.router import aroute
    from llm_routing.types import AuditRequest

    # The counts the strategy reads, per decision and candidate.
    seen: list[dict[str, int]] = []
    count = balance._aleases

    async def counting(names: tuple[str, ...], op: str, lease: str = "") -> list[int]:
        out = await count(names, op, lease)
        if op == "count":
            seen.append(dict(zip(names, out, strict=True)))
        return out

    balance._aleases = counting
    request = AuditRequest(task="t", input_text="x", chain="busy")
    loop = asyncio.get_running_loop()
    stop = loop.time() + seconds
    served: Counter[str] = Counter()

    async def client() -> None:
        if counters == "per request":
            balance._local.table.set(balance._LocalLeases())  # type: ignore[attr-defined]
        while loop.time() < stop:
            served[(await aroute(request, persist=False)).result.provider] += 1

    samples: list[tuple[int, int]] = []

    async def sampler() -> None:
        while loop.time() < stop:
            samples.append((SleepyProvider.in_flight["fast"], SleepyProvider.in_flight["slow"]))
            await asyncio.sleep(0.005)

    await asyncio.gather(sampler(), *(client() for _ in range(clients)))
    return {
        "fast": sum(s[0] for s in samples) / len(samples),
        "slow": sum(s[1] for s in samples) / len(samples),
        "served": dict(served),
        "seen": {
            name: sum(s.get(name, 0) for s in seen) / max(len(seen), 1) for name in ("fast", "slow")
        },
    }


def _lif_worker(
    clients: int,
    seconds: float,
    fast_ms: float,
    counters: str,
    cache_url: str,
    barrier: Any,
    results: Any,
) -> None:
    os.environ["CACHE_URL"] = cache_url
    # A file: a snapshot rebuilt in a worker thread (the other process's rows bump the
    # shared configuration version) must see the tables.
    _setup(f"sqlite:///{tempfile.mkdtemp(prefix='bench-strategies-')}/lif.sqlite3")
    _register()
    from asgiref.sync import async_to_sync

    from llm_routing import snapshot
    from llm_routing.models import Provider

    _chain("busy", "least_in_flight", [("fast", 1), ("slow", 1)])
    Provider.objects.filter(name__in=["fast", "slow"]).update(mode="live", kind="bench_sleepy")
    SleepyProvider.delays = {"fast": fast_ms / 1000, "slow": 5 * fast_ms / 1000}
    _keep_leases(counters)
    barrier.wait()  # every process has written its rows; its clients start at once
    snapshot.current()  # built here, outside the loop
    results.put(async_to_sync(_least_in_flight)(clients, seconds, counters))


def least_in_flight(
    clients: int, workers: int, seconds: float, fast_ms: float, redis_url: str
) -> list[str]:
    ctx = multiprocessing.get_context("spawn")
    rows = []
    for counters in COUNTERS:
        if counters == "shared" and not redis_url:
            rows.append("| least_in_flight, shared counters | (needs --redis-url) | - | - |")
            continue
        if redis_url:
            import redis

            redis.Redis.from_url(redis_url).flushdb()  # no lease left by the previous run
        barrier, results = ctx.Barrier(workers), ctx.Queue()
        cache_url = redis_url or "locmemcache://bench-strategies?MAX_ENTRIES=1000000"
        procs = [
            ctx.Process(
                target=_lif_worker,
                args=(clients // workers, seconds, fast_ms, counters, cache_url, barrier, results),
            )
            for _ in range(workers)
        ]
        for p in procs:
            p.start()
        parts = [results.get() for _ in procs]
        for p in procs:
            p.join()
        fast = sum(p["fast"] for p in parts)
        slow = sum(p["slow"] for p in parts)
        # What a decision read, on average over the processes' decisions.
        seen = {c: sum(p["seen"][c] for p in parts) / workers for c in ("fast", "slow")}
        served: Counter[str] = sum((Counter(p["served"]) for p in parts), Counter())
        n = sum(served.values())
        share = slow / (fast + slow)
        ratio = share / 0.5  # the fair share of two candidates: half of the calls in flight
        rows.append(
            f"| least_in_flight, {counters} counters: {workers} processes x "
            f"{clients // workers} clients, {fast_ms:g} / {5 * fast_ms:g} ms, {seconds:g} s "
            f"({n} requests, {100.0 * served['slow'] / n:.1f} % to the slow one) | "
            f"calls in flight (sampled at the adapters, all processes): fast {fast:.1f}, slow "
            f"{slow:.1f}; counts a decision read: fast {seen['fast']:.1f}, slow "
            f"{seen['slow']:.1f} | slow: {100 * share:.1f} % of the "
            f"calls in flight, {ratio:.2f} x its fair share (target <= 1.5) | "
            f"{'yes' if ratio <= 1.5 else 'NO'} |"
        )
    return rows


# --- hedging ---------------------------------------------------------------------------


def _fake_upstream(port_out: Any) -> None:
    """A fake OpenAI Chat Completions server (aiohttp), until killed; ``GET /stats``
    gives its counts, ``POST /reset`` zeroes them."""
    from aiohttp import web

    stats: dict[str, Counter[str]] = {
        "requests": Counter(),
        "completed": Counter(),
        "disconnects": Counter(),
    }
    # What became of each request, by model and the bench's request number.
    outcomes: dict[str, dict[str, str]] = {}

    async def chat(request: web.Request) -> web.Response:
        body = await request.read()
        model = json.loads(body).get("model", "")
        number = re.search(rb"req-(\d+)-", body)
        key = number.group(1).decode() if number else "?"
        stats["requests"][model] += 1
        outcomes.setdefault(model, {})[key] = "open"
        if model == "steady":
            delay = 0.3
        else:
            delay = 8.0 if SLOW_MARK.encode() in body else 0.2
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:  # the client closed the connection (aiohttp's
            stats["disconnects"][model] += 1  # handler_cancellation)
            outcomes[model][key] = "disconnect"
            raise
        stats["completed"][model] += 1
        outcomes[model][key] = "completed"
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22},
            }
        )

    async def get_stats(request: web.Request) -> web.Response:
        return web.json_response({**{k: dict(v) for k, v in stats.items()}, "outcomes": outcomes})

    async def reset(request: web.Request) -> web.Response:
        for counter in stats.values():
            counter.clear()
        outcomes.clear()
        return web.json_response({})

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/stats", get_stats)
        app.router.add_post("/reset", reset)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port_out.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(serve())


def _upstream(port: int, path: str, method: str = "GET") -> dict[str, Any]:
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    with urllib.request.urlopen(req, timeout=10) as answer:
        out: dict[str, Any] = json.loads(answer.read())
    return out


def _hedged_request(i: int, chain: str) -> Any:
    """Request ``i`` of the hedging run: one in twenty makes the primary take 8 s."""
    from llm_routing.types import AuditRequest

    text = f"req-{i}- {SLOW_MARK}" if i % 20 == 0 else f"req-{i}- hello"
    return AuditRequest(task="t", input_text=text, chain=chain)


async def _hedging(requests: int, clients: int, chain: str, ids: list[str]) -> list[float]:
    """End-to-end latencies (s), sorted; request ``i`` is routed as ``ids[i]``."""
    from llm_routing.router import aroute

    loop = asyncio.get_running_loop()
    todo = iter(range(requests))
    latencies: list[float] = []

    async def client() -> None:
        for i in todo:
            request = _hedged_request(i, chain)
            start = loop.time()
            routed = await aroute(request, persist=True, request_id=ids[i])
            latencies.append(loop.time() - start)
            assert routed.result.ok, routed.result.error

    await asyncio.gather(*(client() for _ in range(clients)))
    return sorted(latencies)


def _hedging_sync(requests: int, clients: int, chain: str, ids: list[str]) -> list[float]:
    """:func:`_hedging` on the sync driver (``route()``): ``clients`` threads."""
    import threading

    from django.db import connections

    from llm_routing.router import route

    todo = iter(range(requests))
    lock = threading.Lock()
    latencies: list[float] = []

    def client() -> None:
        try:
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                start = time.perf_counter()
                routed = route(_hedged_request(i, chain), persist=True, request_id=ids[i])
                latencies.append(time.perf_counter() - start)
                assert routed.result.ok, routed.result.error
        finally:
            connections.close_all()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(latencies)


def _hedging_worker(
    requests: int,
    clients: int,
    cache_url: str,
    database_url: str,
    port: int,
    results: Any,
    driver: str = "async",
) -> None:
    os.environ["CACHE_URL"] = cache_url
    os.environ[KEY_ENV] = "sk-bench-fake"
    _setup(database_url)
    from asgiref.sync import async_to_sync
    from django.db.models import Count, Sum

    from llm_routing import recorder, snapshot
    from llm_routing.models import Attempt, Chain, ChainEntry, Provider, RoutingDecision

    RoutingDecision.objects.all().delete()  # a database kept from an earlier run
    Chain.objects.all().delete()
    Provider.objects.all().delete()
    providers = [
        Provider.objects.create(
            name=name,
            kind="openai_compatible",
            model=name,
            mode="live",
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key_env=KEY_ENV,
            max_retries=0,
            input_price_per_mtok=1,
            output_price_per_mtok=2,
        )
        for name in ("tail", "steady")
    ]
    for chain, hedge in (("unhedged", ""), ("hedged", "400")):
        row = Chain.objects.create(name=chain, hedge_after_ms=hedge)
        for position, provider in enumerate(providers):
            ChainEntry.objects.create(chain=row, provider=provider, position=position)
    snapshot.current()
    out: dict[str, Any] = {}
    for chain in ("unhedged", "hedged"):
        _upstream(port, "/reset", "POST")
        ids = [str(uuid.uuid4()) for _ in range(requests)]
        if driver == "sync":
            latencies = _hedging_sync(requests, clients, chain, ids)
            # A sync loser's call runs to its end in the background (docs/strategies.md,
            # "The two drivers"): wait for the upstream to have answered every request.
            time.sleep(9.0)
        else:
            latencies = async_to_sync(_hedging)(requests, clients, chain, ids)
        recorder.flush(60.0)
        time.sleep(1.0)  # the upstream sees the last disconnects
        upstream = _upstream(port, "/stats")
        attempts = Attempt.objects.filter(decision__chain_name=chain)
        # Each hedge_lost attempt against what its upstream request became.
        number = {rid: str(i) for i, rid in enumerate(ids)}
        fate: Counter[str] = Counter()
        lost_keys = set()
        for rid, name in attempts.filter(outcome="hedge_lost").values_list(
            "decision__request_id", "provider"
        ):
            key = number[str(rid)]
            lost_keys.add((name, key))
            fate[upstream["outcomes"].get(name, {}).get(key, "never arrived")] += 1
        fate["disconnect without a hedge_lost row"] = sum(
            1
            for model, seen in upstream["outcomes"].items()
            for key, what in seen.items()
            if what == "disconnect" and (model, key) not in lost_keys
        )
        by_outcome = {
            (a["provider"], a["outcome"]): (a["n"], a["cost"], a["priced"])
            for a in attempts.values("provider", "outcome").annotate(
                n=Count("id"), cost=Sum("cost_usd"), priced=Count("cost_usd")
            )
        }
        out[chain] = {
            "p99": latencies[max(0, int(0.99 * len(latencies)) - 1)],
            "p50": latencies[len(latencies) // 2],
            "upstream": upstream,
            "fate": dict(fate),
            "attempts": {f"{p}/{o}": v for (p, o), v in by_outcome.items()},
            "decisions": RoutingDecision.objects.filter(chain_name=chain).count(),
        }
    results.put(out)


def hedging(
    requests: int, clients: int, redis_url: str, database_url: str, driver: str = "async"
) -> list[str]:
    ctx = multiprocessing.get_context("spawn")
    port_out, results = ctx.Queue(), ctx.Queue()
    upstream = ctx.Process(target=_fake_upstream, args=(port_out,), daemon=True)
    upstream.start()
    try:
        port = port_out.get(timeout=60)
        if redis_url:
            import redis

            redis.Redis.from_url(redis_url).flushdb()
        cache_url = redis_url or "locmemcache://bench-strategies?MAX_ENTRIES=1000000"
        tmp = tempfile.mkdtemp(prefix="bench-strategies-")
        db = database_url or f"sqlite:///{tmp}/hedging.sqlite3"
        worker = ctx.Process(
            target=_hedging_worker,
            args=(requests, clients, cache_url, db, port, results, driver),
        )
        worker.start()
        out = results.get()
        worker.join()
    finally:
        upstream.terminate()
        upstream.join()
    plain, hedged = out["unhedged"], out["hedged"]

    def total(run: dict[str, Any], what: str) -> int:
        return sum(run["upstream"][what].values())

    per_request = total(hedged, "requests") / requests
    lost = {k: v for k, v in hedged["attempts"].items() if k.endswith("/hedge_lost")}
    lost_n = sum(v[0] for v in lost.values())
    lost_priced = sum(v[2] for v in lost.values())
    lost_usd = sum(float(v[1] or 0) for v in lost.values())
    disconnects = hedged["upstream"]["disconnects"]
    recorded = {k.split("/")[0]: v[0] for k, v in lost.items()}
    match = disconnects == recorded and total(plain, "disconnects") == 0
    ratio = hedged["p99"] / plain["p99"]
    ok = (
        ratio <= 0.2
        and per_request <= 1.10
        and match
        and lost_priced == lost_n
        and hedged["decisions"] == plain["decisions"] == requests
    )
    fate = ", ".join(f"{what} {n}" for what, n in sorted(hedged["fate"].items()))
    where = "PostgreSQL" if database_url.startswith("postgres") else "SQLite"
    how = (
        f"{clients} threads on the sync driver (route(); a loser's call cannot be "
        "interrupted and runs to its end)"
        if driver == "sync"
        else f"{clients} clients"
    )
    return [
        f"| hedging, {requests} requests, {how}, real sockets to a fake "
        f"upstream: primary 200 ms (95 %) / 8 s (5 %), second 300 ms, hedge_after_ms = 400, "
        f"persist=True on {where} | p99 unhedged {plain['p99']:.2f} s (p50 "
        f"{plain['p50']:.2f}), hedged {hedged['p99']:.2f} s (p50 {hedged['p50']:.2f}); "
        f"upstream calls per request {total(plain, 'requests') / requests:.3f} unhedged, "
        f"{per_request:.3f} hedged; upstream disconnects {json.dumps(disconnects)} "
        f"(unhedged: {total(plain, 'disconnects')}), completed "
        f"{total(hedged, 'completed')} of {total(hedged, 'requests')}; hedge_lost Attempt "
        f"rows {json.dumps(recorded)} ({lost_priced} priced, charged ${lost_usd:.6f}); "
        f"what the upstream saw of each hedge_lost attempt: {fate}; decision rows "
        f"{plain['decisions']} + {hedged['decisions']} | p99 hedged / unhedged = "
        f"{ratio:.2f} (target <= 0.20), calls per request {per_request:.3f} (<= 1.10), "
        f"disconnects = hedge_lost rows: {'yes' if match else 'NO'} | "
        f"{'yes' if ok else 'NO'} |"
    ]


# --- adapters ---------------------------------------------------------------------------


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
        """Sleeps ``delays[name]`` seconds; counts the calls in flight per provider."""

        kind: ClassVar[str] = "bench_sleepy"
        in_flight: ClassVar[Counter[str]] = Counter()
        delays: ClassVar[dict[str, float]] = {}

        async def acomplete(self, request: Any, *, api_key: Any, timeout: float) -> Any:
            name = self.config.name
            SleepyProvider.in_flight[name] += 1
            try:
                await asyncio.sleep(SleepyProvider.delays[name])
            finally:
                SleepyProvider.in_flight[name] -= 1
            return self.complete(request, api_key=api_key, timeout=timeout)

    registry.register("bench_instant", InstantProvider)
    registry.register("bench_sleepy", SleepyProvider)


SleepyProvider: Any = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--fast-ms", type=float, default=20.0)
    parser.add_argument("--hedge-requests", type=int, default=2000)
    parser.add_argument("--hedge-clients", type=int, default=20)
    parser.add_argument(
        "--hedge-driver",
        choices=["async", "sync"],
        default="async",
        help="hedging through aroute() on one event loop, or route() in threads",
    )
    parser.add_argument("--only", choices=["weighted", "affinity", "least_in_flight", "hedging"])
    parser.add_argument(
        "--redis-url",
        default=DEFAULT_REDIS,
        help="the routing cache on this Redis, flushed first ('' : LocMem)",
    )
    parser.add_argument(
        "--database-url",
        default="",
        help="hedging's database, emptied of routing rows first (default: SQLite, temp file)",
    )
    args = parser.parse_args()
    started = datetime.now(UTC)
    load_before = os.getloadavg()
    if args.redis_url:
        os.environ["CACHE_URL"] = args.redis_url
    wanted = {args.only} if args.only else {"weighted", "affinity", "least_in_flight", "hedging"}
    rows = weighted(args.requests, args.workers) if "weighted" in wanted else []
    if "affinity" in wanted:
        _setup()
        from django.core.cache import caches

        caches["default"].clear()  # no circuit or affinity left by an earlier run
        _register()
        rows += affinity(args.conversations)
    if "least_in_flight" in wanted:
        rows += least_in_flight(
            args.clients, args.workers, args.seconds, args.fast_ms, args.redis_url
        )
    if "hedging" in wanted:
        rows += hedging(
            args.hedge_requests,
            args.hedge_clients,
            args.redis_url,
            args.database_url,
            args.hedge_driver,
        )
    load_after = os.getloadavg()
    command = shlex.join([".venv/bin/python", "bench/strategies.py", *sys.argv[1:]])
    database = args.database_url.split("@")[-1] if args.database_url else "SQLite (temp file)"
    print(
        f"{started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs; load average (1/5/15 min) "
        f"before {' '.join(f'{x:.2f}' for x in load_before)}, after "
        f"{' '.join(f'{x:.2f}' for x in load_after)}; routing cache "
        f"{args.redis_url or 'LocMem'}; hedging's database {database}; run "
        f"{uuid.uuid4().hex[:8]}\n\n`{command}`\n"
    )
    print("| run | measured | figure | target met |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
