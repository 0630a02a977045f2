#!/usr/bin/env python3
"""One upstream call on each async transport (``LLM_ROUTING["ASYNC_HTTP_TRANSPORT"]``):
the process CPU of ``OpenAICompatibleProvider.acomplete()`` and of a bare POST through
the adapter's own ``httpx.AsyncClient``, over aiohttp and over httpcore.

    .venv/bin/python bench/async_transport.py [-n 4000] [--rounds 8]

The upstream is bench/gateways.py's fake OpenAI-format server in its own process (its
CPU is not counted), keep-alive. Both transports are measured in one process in
alternating blocks (``--rounds``), 1 call in flight and 16, so a neighbour's load on a
shared machine falls on both alike; the median block of each is printed with the load
average. The figures: docs/design-decisions.md ("The async upstream client").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from bench import gateways  # noqa: E402
from llm_routing import conf  # noqa: E402
from llm_routing.providers.base import HttpProvider  # noqa: E402
from llm_routing.providers.registry import get_adapter_class  # noqa: E402
from llm_routing.types import AuditRequest, ProviderConfig  # noqa: E402

TRANSPORTS = ("aiohttp", "httpx")
REQUEST = AuditRequest(task="bench", input_text="Summarize: revenue rose 4%.")
BODY = json.dumps(gateways.BODY).encode()


async def _cpu_per_call(call: Callable[[], Awaitable[object]], n: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await call()

    cpu = time.process_time()
    await asyncio.gather(*(one() for _ in range(n)))
    return (time.process_time() - cpu) / n * 1e6


def _adapter(port: int, transport: str) -> HttpProvider:
    """An adapter whose async client (built now, on the running loop) uses ``transport``."""
    conf.DEFAULTS["ASYNC_HTTP_TRANSPORT"] = transport
    conf.routing_settings.reload()
    config = ProviderConfig(
        name=f"fast-{transport}",
        kind="openai_compatible",
        model="fake-fast",
        base_url=f"http://127.0.0.1:{port}/v1",
        timeout_s=30.0,
        first_token_timeout_s=30.0,
    )
    adapter = get_adapter_class("openai_compatible")(config)
    assert isinstance(adapter, HttpProvider)
    adapter.aclient  # noqa: B018 - built here, with this transport
    return adapter


async def _measure(port: int, n: int, rounds: int) -> dict[tuple[str, int], float]:
    adapters = {t: _adapter(port, t) for t in TRANSPORTS}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    headers = {"content-type": "application/json", "authorization": "Bearer x"}
    calls: dict[str, Callable[[], Awaitable[object]]] = {}
    for transport, adapter in adapters.items():

        async def acomplete(adapter: HttpProvider = adapter) -> object:
            result = await adapter.acomplete(REQUEST, api_key="x", timeout=30.0)
            assert result.ok
            return result

        async def post(adapter: HttpProvider = adapter) -> object:
            response = await adapter.aclient.post(url, content=BODY, headers=headers)
            return json.loads(response.content)

        calls[f"acomplete(), {transport}"] = acomplete
        calls[f"bare POST, {transport}"] = post
    for call in calls.values():  # warm: connections, lazy imports
        await asyncio.gather(*(call() for _ in range(16)))
        for _ in range(50):
            await call()
    per: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for name, call in calls.items():
            for concurrency in (1, 16):
                per.setdefault((name, concurrency), []).append(
                    await _cpu_per_call(call, n // rounds, concurrency)
                )
    for adapter in adapters.values():
        await adapter.aclose()
    return {key: sorted(v)[len(v) // 2] for key, v in per.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=4000, help="calls per variant and level")
    parser.add_argument("--rounds", type=int, default=8, help="alternating blocks")
    args = parser.parse_args()
    port = gateways.free_port()
    upstream = multiprocessing.Process(target=gateways.serve_upstream, args=(port, 0.0))
    upstream.daemon = True
    upstream.start()
    gateways.wait_port(port)
    load = os.getloadavg()[0]
    try:
        measured = asyncio.run(_measure(port, args.n, args.rounds))
    finally:
        upstream.terminate()
    after = os.getloadavg()[0]
    print(f"load average {load:.1f} before, {after:.1f} after; median of {args.rounds} blocks")
    print("| call | CPU µs per call, 1 in flight | 16 in flight |")
    print("|---|---:|---:|")
    for name in dict.fromkeys(k[0] for k in measured):
        print(f"| {name} | {measured[(name, 1)]:.0f} | {measured[(name, 16)]:.0f} |")


if __name__ == "__main__":
    main()
