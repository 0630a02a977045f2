#!/usr/bin/env python3
"""Concurrent streams on the demo's WSGI server: gunicorn ``gthread`` workers.

    .venv/bin/python bench/stream_concurrency.py                 # N = 25, 50, 100
    .venv/bin/python bench/stream_concurrency.py --write         # also update docs/streaming.md
    .venv/bin/python bench/stream_concurrency.py --database-url postgres://postgres@127.0.0.1:5432/llmr_i5

Starts gunicorn (``project.wsgi``, ``-k gthread``, 2 workers x 50 threads by default,
bound to 127.0.0.1 on a free port, the demo project's settings over a temporary SQLite
file unless ``--database-url`` says otherwise) and the test suite's fake upstream,
which streams every answer slowly (20 chunks, 100 ms apart: ≥ 1.9 s per stream). Then,
for each N, opens N concurrent ``POST /v1/chat/completions`` streams at once
(loopback only, N bounded by ``--max-n``) and reports the streams that completed with
the exact text and ``[DONE]``, the errors, the wall time, the slowest time-to-first-
token, and the CPU time the gunicorn processes used during the run (from
``/proc/<pid>/stat``: utime + stime of the master and its workers).

Every stream is a plain blocking iterator: it holds one worker thread, blocked in a
socket read on the upstream, for its whole duration — no CPU pinned while it waits.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import replace_docs_section  # noqa: E402

BEGIN = "<!-- stream-concurrency:begin -->"
END = "<!-- stream-concurrency:end -->"
CHUNKS = 20
ANSWER = " ".join(f"w{i}" for i in range(CHUNKS))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(root_pid: int) -> float:
    """utime + stime of ``root_pid`` and its direct children, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid, ppid = int(entry), int(fields[1])
        if pid == root_pid or ppid == root_pid:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


@dataclass
class StreamOutcome:
    ok: bool
    ttft: float
    duration: float
    error: str = ""


def one_stream(
    client: httpx.Client,
    url: str,
    token: str,
    barrier: threading.Barrier,
    out: list[StreamOutcome],
) -> None:
    body = {"model": "default", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    barrier.wait()
    started = time.perf_counter()
    ttft = 0.0
    text: list[str] = []
    done = False
    try:
        with client.stream(
            "POST", url, json=body, headers={"authorization": f"Bearer {token}"}
        ) as response:
            if response.status_code != 200:
                out.append(StreamOutcome(False, 0.0, 0.0, f"HTTP {response.status_code}"))
                return
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    out.append(StreamOutcome(False, ttft, 0.0, str(chunk["error"].get("code"))))
                    return
                for choice in chunk.get("choices") or []:
                    content = choice["delta"].get("content")
                    if content:
                        text.append(content)
                        ttft = ttft or time.perf_counter() - started
    except Exception as exc:
        out.append(StreamOutcome(False, ttft, 0.0, type(exc).__name__))
        return
    ok = done and "".join(text) == ANSWER
    out.append(StreamOutcome(ok, ttft, time.perf_counter() - started, "" if ok else "text"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[25, 50, 100])
    parser.add_argument("--max-n", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--database-url", default="")
    parser.add_argument("--gunicorn-timeout", type=int, default=120)
    parser.add_argument("--write", action="store_true", help="update docs/streaming.md")
    args = parser.parse_args()
    if any(n < 1 or n > args.max_n for n in args.n):
        raise SystemExit(f"N must be within 1..{args.max_n}")

    tmp = tempfile.TemporaryDirectory(prefix="llmr-bench-")
    database_url = args.database_url or f"sqlite:///{tmp.name}/bench.sqlite3"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": database_url,
        "DEBUG": "false",
        "SECRET_KEY": "bench-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "LLM_ROUTING_USER_RATE": "1000000/min",
        "BENCH_PROVIDER_KEY": "sk-bench-0123456789",
        "CACHE_URL": "locmemcache://bench",
        "LLM_ROUTING_LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)

    import django

    django.setup()
    import logging

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from llm_routing.models import Chain, ChainEntry, Provider
    from tests.fakes.upstream import FakeUpstream, Faults

    logging.getLogger("llm_routing").setLevel(logging.WARNING)
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    fake = FakeUpstream().start()
    row = Provider.objects.create(
        name="slow-upstream",
        kind="openai",
        model="gpt-slow",
        base_url=f"{fake.url}/v1",
        api_key_env="BENCH_PROVIDER_KEY",
        max_retries=0,
        timeout_s=60.0,
        supports_streaming=True,
    )
    chain = Chain.objects.create(name="default", is_default=True)
    ChainEntry.objects.create(chain=chain, provider=row, position=0)
    user = get_user_model().objects.create_user("bench", password="pw-bench-123")
    token = Token.objects.create(user=user).key
    from django.db import connections

    connections.close_all()

    port = free_port()
    gunicorn = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "project.wsgi:application",
            "--worker-class",
            "gthread",
            "--workers",
            str(args.workers),
            "--threads",
            str(args.threads),
            "--bind",
            f"127.0.0.1:{port}",
            "--timeout",
            str(args.gunicorn_timeout),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    rows: list[str] = []
    # One pooled client for every load thread (no per-stream TLS/context set-up cost).
    client = httpx.Client(
        timeout=30.0,
        limits=httpx.Limits(max_connections=args.max_n + 1, max_keepalive_connections=0),
    )
    try:
        for _ in range(200):
            try:
                httpx.get(f"{base}/health/", timeout=1.0)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise SystemExit("gunicorn did not start")
        url = f"{base}/v1/chat/completions"
        fake.script("openai", Faults.stream(text=ANSWER))  # warm-up: both workers load
        warm: list[StreamOutcome] = []
        one_stream(client, url, token, threading.Barrier(1), warm)
        if not warm[0].ok:
            raise SystemExit(f"warm-up stream failed: {warm[0]}")
        for n in args.n:
            fake.script("openai", *[Faults.stream(text=ANSWER, interval=args.interval)] * n)
            outcomes: list[StreamOutcome] = []
            barrier = threading.Barrier(n)
            threads = [
                threading.Thread(target=one_stream, args=(client, url, token, barrier, outcomes))
                for _ in range(n)
            ]
            cpu_before = cpu_seconds(gunicorn.pid)
            started = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - started
            cpu = cpu_seconds(gunicorn.pid) - cpu_before
            ok = [o for o in outcomes if o.ok]
            errors = sorted({o.error for o in outcomes if not o.ok})
            durations = [o.duration for o in ok] or [0.0]
            failed = f"{n - len(ok)}" + (f" ({', '.join(errors)})" if errors else "")
            row_text = (
                f"| {n} | {len(ok)}/{n} | {failed} "
                f"| {wall:.2f} | {statistics.median(durations):.2f} "
                f"| {max((o.ttft for o in ok), default=0.0) * 1000:.0f} "
                f"| {cpu:.2f} | {100 * cpu / wall:.0f} % |"
            )
            rows.append(row_text)
            print(row_text, flush=True)
            time.sleep(0.5)
    finally:
        client.close()
        gunicorn.terminate()
        gunicorn.wait(timeout=30)
        fake.stop()
        tmp.cleanup()

    db = "PostgreSQL" if database_url.startswith("postgres") else "SQLite (file)"
    table = "\n".join(
        [
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
            f"{platform.machine()} / Python {platform.python_version()}, {os.cpu_count()} CPUs "
            f"(shared with the load generator and the fake upstream): gunicorn "
            f"`-k gthread --workers {args.workers} --threads {args.threads}` "
            f"({args.workers * args.threads} stream slots), demo settings over {db}; "
            f"every stream {CHUNKS} chunks {args.interval * 1000:.0f} ms apart "
            f"(≥ {(CHUNKS - 1) * args.interval:.1f} s).",
            "",
            "| concurrent streams | completed | errors | wall s | median stream s "
            "| slowest TTFT ms | gunicorn CPU s | CPU / wall |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    print()
    print(table)
    if args.write:
        write_docs(table)


def write_docs(table: str) -> None:
    path = ROOT / "docs" / "streaming.md"
    block = f"{BEGIN}\n{table}\n{END}"
    replace_docs_section(path, BEGIN, END, block, append_if_missing=False)


if __name__ == "__main__":
    main()
