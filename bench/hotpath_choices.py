#!/usr/bin/env python3
"""Measured choices for the hot path (issue 23, item 4): the upstream HTTP client, the
JSON codec and the ASGI server, each measured before choosing.

    PYTHONPATH=/path/to/candidates .venv/bin/python bench/hotpath_choices.py \\
        --database-url postgres://postgres@127.0.0.1:5432/llm_routing_gateways \\
        --redis-url redis://127.0.0.1:6379/0 [--parts json,client,server]

The candidates that are not the app's dependencies (orjson, msgspec, granian; aiohttp
is one now, under the async adapters' httpx client) are imported from wherever
``PYTHONPATH`` points (``pip install --target DIR orjson msgspec granian``); a missing
one is reported, not measured. bench/async_transport.py measures the adapters' call on
each async transport.

* ``json``: µs per encode of a ``chat.completion`` answer and per decode of a chat
  request body (the shapes the app encodes and decodes once or twice per request),
  best of 7 repeats;
* ``client``: process CPU per POST to bench/gateways.py's fake OpenAI-format upstream
  (its own process, keep-alive) through ``httpx.AsyncClient`` (what the adapters use),
  ``httpcore.AsyncConnectionPool`` directly, and ``aiohttp.ClientSession``, one in
  flight and 16 in flight, alternating blocks, median block;
* ``server``: the demo project's application (``project.asgi:application``, the lean
  lane) in one worker under the shipped gunicorn + uvicorn worker and under granian,
  wrk at 1 and 16 connections: req/s and the worker's CPU per request.

The figures and the choice: docs/design-decisions.md ("Measured choices for the hot
path").
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import multiprocessing
import os
import sys
import time
import timeit
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gateways  # noqa: E402

ANSWER = {
    "id": "chatcmpl-0123456789abcdef0123456789abcdef",
    "object": "chat.completion",
    "created": 1_775_000_000,
    "model": "fake-fast",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Revenue rose 4%.", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25, "cost_usd": None},
    "system_fingerprint": None,
}
REQUEST = json.dumps(gateways.BODY).encode()


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def bench_json() -> list[str]:
    codecs: dict[str, tuple[Callable[[Any], Any], Callable[[bytes], Any]]] = {
        "json (stdlib)": (lambda o: json.dumps(o).encode(), json.loads)
    }
    orjson = _optional("orjson")
    if orjson is not None:
        codecs["orjson"] = (orjson.dumps, orjson.loads)
    msgspec = _optional("msgspec")
    if msgspec is not None:
        codecs["msgspec"] = (msgspec.json.encode, msgspec.json.decode)
    lines = ["| codec | encode answer (µs) | decode request (µs) |", "|---|---:|---:|"]
    for name, (encode, decode) in codecs.items():
        n = 20_000
        enc = min(timeit.repeat(lambda e=encode: e(ANSWER), number=n, repeat=7)) / n * 1e6
        dec = min(timeit.repeat(lambda d=decode: d(REQUEST), number=n, repeat=7)) / n * 1e6
        lines.append(f"| {name} | {enc:.2f} | {dec:.2f} |")
    for missing in {"orjson", "msgspec"} - {k for k in codecs}:
        lines.append(f"| {missing} | not installed | — |")
    return lines


async def _cpu_per_call(call: Callable[[], Awaitable[None]], n: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await call()

    cpu = time.process_time()
    await asyncio.gather(*(one() for _ in range(n)))
    return (time.process_time() - cpu) / n * 1e6


async def _clients(url: str, n: int, rounds: int) -> dict[tuple[str, int], float]:
    import httpcore
    import httpx

    headers = {"content-type": "application/json", "authorization": "Bearer x"}
    makers: dict[str, Callable[[], Awaitable[Any]]] = {}
    closers: list[Callable[[], Awaitable[Any]]] = []

    hx = httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100))
    closers.append(hx.aclose)

    async def via_httpx() -> None:
        response = await hx.post(url, content=REQUEST, headers=headers)
        response.json()

    makers["httpx.AsyncClient"] = via_httpx
    pool = httpcore.AsyncConnectionPool(max_connections=100)
    closers.append(pool.aclose)
    raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]

    async def via_httpcore() -> None:
        response = await pool.request("POST", url, headers=raw_headers, content=REQUEST)
        json.loads(response.content)

    makers["httpcore.AsyncConnectionPool"] = via_httpcore
    aiohttp = _optional("aiohttp")
    if aiohttp is not None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
        closers.append(session.close)

        async def via_aiohttp() -> None:
            async with session.post(url, data=REQUEST, headers=headers) as response:
                json.loads(await response.read())

        makers["aiohttp.ClientSession"] = via_aiohttp
    for call in makers.values():  # warm: connections and lazy imports
        for _ in range(50):
            await call()
    per: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for name, call in makers.items():
            for concurrency in (1, 16):
                per.setdefault((name, concurrency), []).append(
                    await _cpu_per_call(call, n // rounds, concurrency)
                )
    for close in closers:
        await close()
    return {key: sorted(v)[len(v) // 2] for key, v in per.items()}


def bench_client(n: int, rounds: int) -> list[str]:
    port = gateways.free_port()
    upstream = multiprocessing.Process(target=gateways.serve_upstream, args=(port, 0.0))
    upstream.daemon = True
    upstream.start()
    gateways.wait_port(port)
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        measured = asyncio.run(_clients(url, n, rounds))
    finally:
        upstream.terminate()
    lines = ["| client | CPU µs per call, 1 in flight | 16 in flight |", "|---|---:|---:|"]
    for name in dict.fromkeys(k[0] for k in measured):
        lines.append(f"| {name} | {measured[(name, 1)]:.0f} | {measured[(name, 16)]:.0f} |")
    if _optional("aiohttp") is None:
        lines.append("| aiohttp.ClientSession | not installed | — |")
    return lines


def bench_server(args: argparse.Namespace) -> list[str]:
    fast = gateways.free_port()
    me = [sys.executable, str(ROOT / "bench" / "gateways.py"), "--serve-upstream"]
    settings = argparse.Namespace(
        database_url=args.database_url,
        redis_url=args.redis_url,
        workers=1,
        record_mode="write_behind",
    )
    lines = [
        "| server (1 worker, the lean lane) | req/s c=1 / 16 | worker CPU per request c=1 / 16 "
        "| load avg |",
        "|---|---:|---:|---|",
    ]
    with gateways.started([*me, str(fast), "0"], port=fast):
        token = gateways.prepare_app(settings, fast, fast)
        headers = {"Authorization": f"Bearer {token}"}
        servers = {
            "gunicorn + uvicorn worker (shipped)": [
                sys.executable,
                "-m",
                "gunicorn",
                "-c",
                "gunicorn.conf.py",
            ],
        }
        granian = _optional("granian")
        if granian is not None:
            servers["granian (asgi, 1 worker)"] = [
                sys.executable,
                "-m",
                "granian",
                "--interface",
                "asgi",
                "--workers",
                "1",
                "--no-ws",
                "--log-level",
                "warning",
                "--host",
                "127.0.0.1",
                "--port",
                "{port}",
                "project.asgi:application",
            ]
        for name, cmd in servers.items():
            port = gateways.free_port()
            env = {**gateways.app_env(settings, port), "GUNICORN_REUSE_PORT": "false"}
            argv = [part.replace("{port}", str(port)) for part in cmd]
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            load = os.getloadavg()[0]
            with gateways.started(argv, port=port, env=env) as proc:
                gateways.warm_up(url, headers, gateways.BODY, count=50)
                figures = []
                for c in (1, 16):
                    run, split = gateways.cpu_during(
                        proc.pid,
                        lambda c=c, url=url: gateways.wrk(  # type: ignore[misc]
                            url, headers, gateways.BODY, connections=c, seconds=args.seconds
                        ),
                    )
                    if run.errors:
                        raise SystemExit(f"{name}: {run.errors} errors at c={c}")
                    figures.append((run.rps, split.ms_per_request))
            lines.append(
                f"| {name} | {figures[0][0]:.0f} / {figures[1][0]:.0f} | "
                f"{figures[0][1]:.2f} / {figures[1][1]:.2f} ms | {load:.1f} |"
            )
        if granian is None:
            lines.append("| granian | not installed | — | — |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--parts", default="json,client,server")
    parser.add_argument("-n", type=int, default=4000, help="client calls per variant")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=8, help="each wrk run (server)")
    args = parser.parse_args()
    os.chdir(ROOT)
    print(f"load average {os.getloadavg()[0]:.1f} at start, {time.strftime('%H:%M UTC')}")
    parts = args.parts.split(",")
    if "json" in parts:
        print("\n".join(bench_json()), "\n", flush=True)
    if "client" in parts:
        print("\n".join(bench_client(args.n, args.rounds)), "\n", flush=True)
    if "server" in parts:
        print("\n".join(bench_server(args)), flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
