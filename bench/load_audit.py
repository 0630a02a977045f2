"""Load bench: ``POST /audit/`` through gunicorn on PostgreSQL (+ Redis cache).

Two scenarios at rising concurrency, loopback only, bounded in count and time:

* ``mock``        — the request names the mock provider (no upstream hop);
* ``upstream-1s`` — the request names an ``openai_compatible`` provider (the real
  adapter) pointed at a local fake OpenAI-format upstream (a subprocess of this
  script) that answers every request after 1 s.

For each level it reports req/s, p50/p99 latency, errors, lost rows (the routing
decisions counted in the database must equal the 200 answers, and every answered
``request_id`` must be in the database) and how many decisions the named provider
served (a fallback to the mock would show here).

    .venv/bin/python bench/load_audit.py \
        --database-url postgres://postgres@127.0.0.1:5432/llm_routing_bench \
        --redis-url redis://127.0.0.1:6379/0

The database is created if missing and migrated; its routing tables are emptied first.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
INPUT = "The quarterly report shows revenue up 4% on strong demand. " * 8


# --- the fake upstream (run as a subprocess: --serve-upstream PORT DELAY) -------------


def serve_upstream(port: int, delay_s: float) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            time.sleep(delay_s)
            body = json.dumps(
                {
                    "id": "chatcmpl-bench",
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "A short summary."},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 120, "completion_tokens": 4},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.request_queue_size = 256
    server.serve_forever()


# --- helpers --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def ensure_database(url: str) -> None:
    import psycopg
    from psycopg import sql

    name = url.rsplit("/", 1)[1].split("?")[0]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))
    return ordered[index]


async def drive(
    url: str, token: str, body: dict[str, Any], *, concurrency: int, total: int
) -> dict[str, Any]:
    import httpx

    latencies: list[float] = []
    statuses: dict[str, int] = {}
    request_ids: list[str] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        limits=limits, timeout=60.0, headers={"Authorization": f"Token {token}"}
    ) as client:

        async def one_client() -> None:
            while True:
                try:
                    queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                started = time.perf_counter()
                try:
                    response = await client.post(url, json=body)
                    key = str(response.status_code)
                    if response.status_code == 200:
                        request_ids.append(response.json()["request_id"])
                except httpx.HTTPError as exc:
                    key = type(exc).__name__
                latencies.append((time.perf_counter() - started) * 1000)
                statuses[key] = statuses.get(key, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "elapsed_s": elapsed,
        "latencies": latencies,
        "statuses": statuses,
        "request_ids": request_ids,
    }


# --- main ---------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "LLMR_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llm_routing_bench"
        ),
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("LLMR_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--levels", default="1,4,16,32,64")
    parser.add_argument("--scenarios", default="mock,upstream-1s")
    parser.add_argument("--mock-requests", type=int, default=300, help="per level")
    parser.add_argument("--upstream-requests-per-client", type=int, default=4)
    parser.add_argument("--upstream-delay", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=16, help="threads per worker")
    parser.add_argument("--conn-max-age", type=int, default=60)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--serve-upstream", nargs=2, metavar=("PORT", "DELAY"))
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(int(args.serve_upstream[0]), float(args.serve_upstream[1]))
        return

    ensure_database(args.database_url)
    env = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG"}}
    env.update(
        DJANGO_SETTINGS_MODULE="bench.settings_bench",
        DEBUG="false",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="127.0.0.1",
        DATABASE_URL=args.database_url,
        CONN_MAX_AGE=str(args.conn_max_age),
        REDIS_URL=args.redis_url,
        BENCH_UPSTREAM_KEY="bench-" + secrets.token_hex(8),
        LLM_ROUTING_LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
    )
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from llm_routing.models import AuditJob, Provider, RoutingDecision

    call_command("migrate", verbosity=0)
    RoutingDecision.objects.all().delete()
    AuditJob.objects.all().delete()
    user, _ = get_user_model().objects.get_or_create(username="bench")
    token = Token.objects.get_or_create(user=user)[0].key

    up_port, web_port = free_port(), free_port()
    Provider.objects.update_or_create(
        name="upstream",
        defaults={
            "kind": "openai_compatible",
            "model": "bench-1",
            "base_url": f"http://127.0.0.1:{up_port}/v1",
            "api_key_env": "BENCH_UPSTREAM_KEY",
            "timeout_s": 10.0,
            "max_retries": 0,
        },
    )
    procs: list[subprocess.Popen[bytes]] = []
    hard_stop = time.monotonic() + args.max_seconds
    results: list[dict[str, Any]] = []
    try:
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--serve-upstream",
                    str(up_port),
                    str(args.upstream_delay),
                ],
                env=env,
                start_new_session=True,
            )
        )
        web_env = dict(
            env,
            GUNICORN_BIND=f"127.0.0.1:{web_port}",
            WEB_CONCURRENCY=str(args.workers),
            GUNICORN_THREADS=str(args.threads),
            GUNICORN_ACCESSLOG="",
            GUNICORN_MAX_REQUESTS="0",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"],
                cwd=ROOT,
                env=web_env,
                start_new_session=True,
            )
        )
        wait_port(up_port)
        wait_port(web_port)
        url = f"http://127.0.0.1:{web_port}/audit/"
        levels = [int(x) for x in args.levels.split(",")]
        scenarios = [
            ("mock", {"task": "summarize", "input_text": INPUT, "provider": "mock"}),
            ("upstream-1s", {"task": "summarize", "input_text": INPUT, "provider": "upstream"}),
        ]
        wanted = set(args.scenarios.split(","))
        for name, body in [s for s in scenarios if s[0] in wanted]:
            asyncio.run(drive(url, token, body, concurrency=4, total=8))  # warm-up
            for level in levels:
                if time.monotonic() > hard_stop:
                    print(f"stopping: --max-seconds {args.max_seconds} reached", file=sys.stderr)
                    break
                total = (
                    args.mock_requests
                    if name == "mock"
                    else max(8, level * args.upstream_requests_per_client)
                )
                before = RoutingDecision.objects.count()
                run = asyncio.run(drive(url, token, body, concurrency=level, total=total))
                recorded = RoutingDecision.objects.count() - before
                answered = run["statuses"].get("200", 0)
                missing = (
                    len(run["request_ids"])
                    - RoutingDecision.objects.filter(request_id__in=run["request_ids"]).count()
                )
                served = RoutingDecision.objects.filter(
                    request_id__in=run["request_ids"], selected_provider=body["provider"]
                ).count()
                row = {
                    "scenario": name,
                    "concurrency": level,
                    "requests": total,
                    "req_per_s": round(total / run["elapsed_s"], 1),
                    "p50_ms": round(statistics.median(run["latencies"]), 1),
                    "p99_ms": round(percentile(run["latencies"], 99), 1),
                    "errors": total - answered,
                    "statuses": run["statuses"],
                    "answered": answered,
                    "decisions_recorded": recorded,
                    "lost_rows": answered - recorded + missing,
                    "served_by_named_provider": served,
                }
                results.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    print()
    print(
        "| scenario | concurrency | requests | req/s | p50 ms | p99 ms | errors "
        "| answered | decisions in DB | lost rows | served by named provider |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['scenario']} | {r['concurrency']} | {r['requests']} | {r['req_per_s']} "
            f"| {r['p50_ms']} | {r['p99_ms']} | {r['errors']} | {r['answered']} "
            f"| {r['decisions_recorded']} | {r['lost_rows']} | {r['served_by_named_provider']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if any(
        r["lost_rows"] or r["errors"] or r["served_by_named_provider"] != r["answered"]
        for r in results
    ):
        sys.exit(1)


if __name__ == "__main__":
    main()
