#!/usr/bin/env python3
"""The CPU one ``/v1/chat/completions`` costs inside the ASGI application, with no
server in front, on each path: the lean lane (``llm_routing.asgi.lane(...)``, what the
demo project's ``project/asgi.py`` serves) and Django's request cycle
(``llm_routing.asgi.get_asgi_application()`` alone), each called directly with ASGI
messages, against bench/gateways.py's fake OpenAI-format upstream (its own process),
with the production settings bench/gateways.py uses (PostgreSQL, Redis, write-behind
recording).

    .venv/bin/python bench/asgi_inprocess.py \\
        --database-url postgres://postgres@127.0.0.1:5432/llm_routing_gateways \\
        --redis-url redis://127.0.0.1:6379/0 [-n 3000] [-c 1] [--served lane,django] \\
        [--async-transport aiohttp,httpx] [--py-spy PATH]

Prints the wall time and the process CPU time per request on each path (the
upstream's CPU is not counted), on each async upstream transport asked for
(``--async-transport``, default the shipped ``aiohttp``; ``aiohttp,httpx`` alternates
the two, rebuilding the adapters at each switch). The paths are measured in
alternating blocks in one process (``--rounds``), so a neighbour's load on a shared
machine falls on each alike; the median block of each is printed with the load average.

With ``--stream-chunks K1,K2`` it measures streamed requests instead (``"stream":
true``; each path of ``--served``): two fake upstreams (bench/stream_concurrency.py's,
the one of the 1,000-stream run) stream K1 and
K2 content chunks (plus the role and stop chunks and ``[DONE]``) to models ``fast`` and
``slow``, measured in alternating blocks; the CPU per chunk is the difference over
K2 - K1, and a stream's opening is what is left at K1 = 1 less one chunk::

    .venv/bin/python bench/asgi_inprocess.py --database-url ... --redis-url ... \
        --served lane --stream-chunks 1,41 -n 2000 [--stream-seconds 1 -c 32] [--py-spy PATH]

With no pauses the upstream's chunks arrive together and are read in a few socket
reads; ``--stream-seconds S`` spreads each stream's chunks over S seconds, so each
arrives alone (one read, one wake-up, one ASGI message per chunk), as in the 1,000-
stream run.

With ``--memory rss`` it prints what the run adds to the process's RSS and the modules
it imports (by package); ``--memory trace`` also traces the run's allocations
(:mod:`tracemalloc`, which itself about doubles the RSS growth) and prints what is
still allocated at the end by the package of the allocating line. With a small ``-n``
(``-n 16 --rounds 1``) that is what a worker gains on its first requests.

With ``--py-spy PATH`` (a py-spy binary; ``pip install py-spy`` in any virtualenv; use
``--served lane`` or ``--served django`` for one path's profile) it samples the run
(GIL-holding samples only, so waiting is not counted) and prints the share of the
request's CPU in each part of the serving path — the profile in docs/benchmarks.md
("Where the time goes").
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gateways  # noqa: E402

#: The parts of the serving path, by a frame that marks each (inclusive shares: a part
#: counts every sample with one of its marks on the stack).
PARTS: dict[str, tuple[str, ...]] = {
    "the lean lane (the request on the event loop)": ("_serve (llm_routing/lane.py",),
    "  the request object (ASGIRequest)": ("__init__ (django/core/handlers/asgi.py",),
    "  the answer sent (ASGI messages)": ("_send_response (llm_routing/lane.py",),
    "the ASGI handler (the request on the event loop)": ("InlineMiddlewareASGIHandler.handle",),
    "  middleware, URL resolution, view": ("RequestIdMiddleware._acall",),
    "    admit: authentication, permissions, throttles, validation, access, budgets": (
        "_ainitial_and_admit",
    ),
    "      DRF's own steps (initialize_request, initial, Request.data, snapshot check)": (
        "initialize_request (",
        "APIView.initial (",
        "_load_data_and_files (",
        "answers_from_memory (",
    ),
    "      throttle (one redis.asyncio script call)": ("aallow_request",),
    "      body validation (DRF serializer)": ("is_valid",),
    "    route: the walk, the adapter, the record": ("aroute",),
    "      adapter and httpx (the upstream call)": ("HttpProvider.acomplete",),
    "        httpx's AsyncClient (its models and hooks, aiohttp inside)": ("AsyncClient.stream (",),
    "        aiohttp (httpx-aiohttp's transport)": ("AiohttpTransport.handle_async_request (",),
    "      circuit breaker (one redis.asyncio GET)": ("Allow.arun",),
    "      circuit breaker's outcome (observe)": ("Observe.arun",),
    "      record (queued for the write-behind thread)": ("Record.arun",),
    "    redis-py's client code (both round trips)": ("Redis.execute_command (",),
    "    DRF response rendering": ("finalize_response (", "_plain (llm_routing/api/base.py"),
    "write-behind thread (batched INSERTs)": ("WriteBehind._run",),
}

#: The parts of a streamed request (``--stream-chunks``), exclusive: each sample counts
#: for the first part one of whose marks is on its stack (the stream's opening first:
#: everything under the view until its first event), the rest is the event loop's own.
STREAM_PARTS: dict[str, tuple[str, ...]] = {
    "opening: the lane, the view until the first event (admission, walk, connect)": (
        "async_view (",
        "_serve (llm_routing/lane",
    ),
    "end: circuit breaker's outcome (Redis)": ("Observe.arun",),
    "end: record (queued)": ("Record.arun",),
    "chunk: key filter (StreamGuard)": ("StreamGuard.",),
    "chunk: SSE framing out (json.dumps, data: ...)": (
        "_Frames.__call__",
        "sse (llm_routing/api/sse",
    ),
    "chunk: the adapter's decode (json.loads, chunk objects)": (
        "ChatCompletionChunkDecoder",
        "StreamDecoder",
        "_StreamRun.feed",
    ),
    "chunk: aiohttp's body iterator": (
        "AiohttpResponseStream.__aiter__",
        "_Body.__aiter__",
        "AsyncStreamIterator",
    ),
    "chunk: httpx's byte and text layers": (
        "aiter_raw (",
        "aiter_bytes (",
        "aiter_text (",
        "BoundAsyncStream",
    ),
    "chunk: httpx-sse's line split and parse": ("_aiter_sse_lines", "aiter_sse ("),
    "chunk: timers rescheduled (asyncio.timeout, aiohttp's read timeout)": (
        "Timeout.reschedule",
        "call_at (",
        "_reschedule_timeout",
        "TimerHandle",
    ),
    "chunk: socket read, aiohttp's protocol (loop callback)": ("data_received", "_read_ready ("),
    "chunk: the router's per-event machinery (effects, _pump)": (
        "NextEvent.arun",
        "_pump (",
        "_route_stream",
        "astream (llm_routing/effects",
    ),
    "chunk: Django's streaming wrapper, request-id middleware, ASGI send": ("_send_response (",),
    "write-behind thread (batched INSERTs)": ("WriteBehind._run",),
    "worker threads (first requests: principal, budgets)": ("thread_handler",),
    "the in-process driver": ("_block.<locals>",),
}


def _scope(token: str, length: int) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/json"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-length", str(length).encode()),
        ],
        "client": ("127.0.0.1", 5555),
        "server": ("127.0.0.1", 8000),
    }


async def _drive(
    apps: dict[str, tuple[Any, str, dict[str, Any]]],
    token: str,
    n: int,
    concurrency: int,
    rounds: int,
) -> dict[str, tuple[float, float]]:
    """Per (path, async transport): the median (wall ms, CPU ms) per request over
    ``rounds`` blocks. Switching the transport rebuilds the adapters (not timed)."""
    per: dict[str, list[tuple[float, float]]] = {name: [] for name in apps}
    current = [""]

    async def use(app: Any, transport: str, body: dict[str, Any]) -> None:
        if transport != current[0]:
            current[0] = transport
            _use_transport(transport)
            await _block(app, token, body, 3 * concurrency, concurrency)  # new connections

    for app, transport, body in apps.values():
        await use(app, transport, body)
        await _block(app, token, body, 50, 1)  # warm: the token cache, the snapshot, pools
    for _ in range(rounds):
        for name, (app, transport, body) in apps.items():
            await use(app, transport, body)
            block = await _block(app, token, body, max(1, n // rounds), concurrency)
            per[name].append(block)
    out = {}
    for name, blocks in per.items():
        walls = sorted(b[0] for b in blocks)
        cpus = sorted(b[1] for b in blocks)
        out[name] = (walls[len(walls) // 2], cpus[len(cpus) // 2])
    return out


def _use_transport(transport: str) -> None:
    """``LLM_ROUTING["ASYNC_HTTP_TRANSPORT"]`` now, for adapters built from here on."""
    from django.conf import settings

    from llm_routing.conf import routing_settings
    from llm_routing.providers import registry

    settings.LLM_ROUTING["ASYNC_HTTP_TRANSPORT"] = transport
    routing_settings.reload()
    registry.clear_adapter_cache()  # each adapter's client is closed on this loop


async def _block(
    app: Any, token: str, payload: dict[str, Any], n: int, concurrency: int
) -> tuple[float, float]:
    body = json.dumps(payload).encode()
    scope = _scope(token, len(body))

    async def one() -> None:
        sent: list[dict[str, Any]] = []
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)  # no disconnect: the handler cancels this
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(dict(scope), receive, send)
        if sent[0]["status"] != 200:
            raise SystemExit(f"HTTP {sent[0]['status']}: {sent[1:]}")
        if payload.get("stream") and b"[DONE]" not in sent[-2].get("body", b""):
            raise SystemExit(f"a stream without [DONE]: {sent[-3:]}")

    gate = asyncio.Semaphore(concurrency)

    async def limited() -> None:
        async with gate:
            await one()

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(limited() for _ in range(n)))
    return (time.perf_counter() - wall) / n * 1000, (time.process_time() - cpu) / n * 1000


def _shares(
    raw: Path, parts: dict[str, tuple[str, ...]], *, exclusive: bool = False
) -> list[tuple[str, float]]:
    """Each part's share of the samples (inclusive, or ``exclusive``: the first part
    that matches; the rest under "the event loop's own")."""
    total = 0
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        frames = stack.split(";")  # "function (path:line)", the class in the name
        if any(m in f for f in frames for m in ("get_asgi_application", "prepare_app")):
            continue  # start-up (the fake upstream is another process: not sampled)
        if any("_find_and_load (" in f for f in frames):
            continue  # a module imported on first use (the warm-up): once per process
        total += int(number)
        matched = False
        for name, marks in parts.items():
            if any(mark in f for f in frames for mark in marks):
                counts[name] += int(number)
                matched = True
                if exclusive:
                    break
        if exclusive and not matched:
            counts[REST] += int(number)
    names = [*parts, REST] if exclusive else list(parts)
    return [(name, 100.0 * counts[name] / max(total, 1)) for name in names]


REST = "the event loop's own (select, task switches, callbacks)"


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _memory_report(rss_before: int, modules_before: set[str], trace: bool) -> None:
    """RSS growth, the modules imported; traced: what is still allocated by the package
    of the allocating line."""
    print(f"RSS {rss_before / 1024:.1f} -> {_rss_kib() / 1024:.1f} MiB")
    new = collections.Counter(m.split(".")[0] for m in set(sys.modules) - modules_before)
    print(
        f"modules imported by the run: {sum(new.values())}: "
        + ", ".join(f"{p} {n}" for p, n in new.most_common())
    )
    if not trace:
        return
    import tracemalloc

    by: collections.Counter[str] = collections.Counter()
    for stat in tracemalloc.take_snapshot().statistics("filename"):
        path = stat.traceback[0].filename
        if "site-packages/" in path:
            package = path.split("site-packages/", 1)[1].split("/", 1)[0]
        elif "/llm_routing/" in path:
            package = "llm_routing"
        elif path.startswith("<"):
            package = path
        else:
            package = "stdlib: " + Path(path).stem
        by[package.removesuffix(".py")] += stat.size
    total = sum(by.values())
    print(f"still allocated, traced: {total / 2**20:.1f} MiB, by package:")
    for package, size in by.most_common(20):
        print(f"  {size / 2**20:6.2f} MiB  {package}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("-n", type=int, default=3000, help="requests measured")
    parser.add_argument("-c", type=int, default=1, help="requests in flight")
    parser.add_argument("--served", default="lane,django", help="the paths: lane, django")
    parser.add_argument("--rounds", type=int, default=10, help="alternating blocks")
    parser.add_argument(
        "--record-mode", default="write_behind", help="LLM_ROUTING_RECORD_MODE (shipped: inline)"
    )
    parser.add_argument(
        "--async-transport",
        default="aiohttp",
        help="the adapters' async client, LLM_ROUTING['ASYNC_HTTP_TRANSPORT'] (shipped: "
        "aiohttp); 'aiohttp,httpx' measures both in alternating blocks",
    )
    parser.add_argument(
        "--stream-chunks",
        help="K1,K2: measure streamed requests of K1 and K2 content chunks (see above)",
    )
    parser.add_argument(
        "--stream-seconds",
        type=float,
        default=0.0,
        help="spread each stream's chunks over this long (0: all at once; >0: each chunk "
        "arrives alone, as in a real stream: use -c to keep many streams open)",
    )
    parser.add_argument(
        "--memory", choices=("rss", "trace"), help="what the run adds to memory (see above)"
    )
    parser.add_argument("--py-spy", help="sample the run with this py-spy binary")
    parser.add_argument(
        "--py-spy-raw", help="keep py-spy's raw samples (collapsed stacks) in this file"
    )
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.py_spy and not args.run:
        raw = Path(args.py_spy_raw or Path(tempfile.mkdtemp()) / "samples.txt")
        argv = [a for a in sys.argv[1:] if not a.startswith("--py-spy")]
        for value in (args.py_spy, args.py_spy_raw):
            if value in argv:
                argv.remove(value)
        cmd = [args.py_spy, "record", "-g", "-r", "300", "-f", "raw", "-o", str(raw), "--"]
        subprocess.run([*cmd, sys.executable, __file__, *argv, "--run"], check=True)
        if args.stream_chunks:
            shares = _shares(raw, STREAM_PARTS, exclusive=True)
        else:
            shares = _shares(raw, PARTS)
        for name, share in shares:
            print(f"{share:5.1f} %  {name}")
        return
    port = gateways.free_port()
    upstreams = [multiprocessing.Process(target=gateways.serve_upstream, args=(port, 0.0))]
    slow_port = port
    chunks = [int(k) for k in args.stream_chunks.split(",")] if args.stream_chunks else []
    if chunks:  # two streaming upstreams: "fast" streams K1 chunks, "slow" K2
        from bench import stream_concurrency

        assert len(chunks) == 2, "--stream-chunks K1,K2"
        slow_port = gateways.free_port()
        upstreams = [
            multiprocessing.Process(
                target=stream_concurrency.serve_upstream, args=(p, k, args.stream_seconds)
            )
            for p, k in zip((port, slow_port), chunks, strict=True)
        ]
    for upstream in upstreams:
        upstream.daemon = True
        upstream.start()
    for p in {port, slow_port}:
        gateways.wait_port(p)
    settings = argparse.Namespace(
        database_url=args.database_url,
        redis_url=args.redis_url,
        workers=1,
        record_mode=args.record_mode,
    )
    token = gateways.prepare_app(settings, port, slow_port)
    os.environ.update(gateways.app_env(settings, 0))
    transports = args.async_transport.split(",")
    os.environ["LLM_ROUTING_ASYNC_HTTP_TRANSPORT"] = transports[0]
    os.chdir(ROOT)
    from llm_routing.asgi import get_asgi_application, lane

    django_app = get_asgi_application()
    known = {"lane": lane(django_app), "django": django_app}
    bodies = {"": gateways.BODY}
    if chunks:
        bodies = {
            f", {k} chunks": {**gateways.BODY, "model": model, "stream": True}
            for k, model in zip(chunks, ("fast", "slow"), strict=True)
        }
    apps = {
        f"{name} ({transport}){label}": (known[name], transport, body)
        for transport in transports
        for name in args.served.split(",")
        for label, body in bodies.items()
    }
    load = os.getloadavg()[0]
    rss_before, modules_before = _rss_kib(), set(sys.modules)
    if args.memory == "trace":
        import tracemalloc

        tracemalloc.start()
    measured = asyncio.run(_drive(apps, token, args.n, args.c, args.rounds))
    if args.memory:
        _memory_report(rss_before, modules_before, args.memory == "trace")
    after = os.getloadavg()[0]
    for name, (wall_ms, cpu_ms) in measured.items():
        print(
            f"{name:16}: {args.n} requests, {args.c} in flight: {wall_ms:.3f} ms wall, "
            f"{cpu_ms:.3f} ms CPU each (median of {args.rounds} blocks; "
            f"load average {load:.1f} before, {after:.1f} after)"
        )
    if chunks:
        (low, (_, cpu_low)), (high, (_, cpu_high)) = zip(chunks, measured.values(), strict=True)
        per_chunk = (cpu_high - cpu_low) / (high - low)
        print(
            f"CPU per streamed chunk: {per_chunk * 1000:.0f} µs; a stream's opening and end "
            f"(its CPU less {low} chunk(s)): {cpu_low - low * per_chunk:.3f} ms"
        )
    for upstream in upstreams:
        upstream.terminate()


if __name__ == "__main__":
    main()
