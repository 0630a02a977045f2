#!/usr/bin/env python3
"""Concurrent streams on the demo's server: gunicorn ``gthread`` (WSGI) or the shipped ASGI config.

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

``--server asgi`` measures the shipped configuration instead (issue 14)::

    .venv/bin/python bench/stream_concurrency.py --server asgi --n 256 500 1000 \
        --stream-seconds 30 --database-url postgres://postgres@127.0.0.1:5432/llmr_i14 \
        --redis-url redis://127.0.0.1:6379/0 [--ramp-seconds 10] [--write]

``gunicorn -c gunicorn.conf.py`` as shipped (uvicorn workers, ``--workers`` of them),
configured as ``bench/gateways.py`` configures the app (PostgreSQL, Redis, decisions
written behind the request); the fake upstream is an asyncio subprocess that streams
``--chunks`` content chunks spread evenly over ``--stream-seconds`` (the first one at
once). For each N the same asyncio load generator (httpx) first opens N streams straight
to the fake upstream ("direct"), then N through the app, all at once (or spread evenly
over ``--ramp-seconds``), and reports streams completed with the exact text and
``[DONE]``, errors, TTFT p50/p99 through the app against direct, the peak RSS of each
worker (sampled every 0.5 s), the CPU seconds the server used, and — after a graceful
stop, which flushes the write-behind queue — whether every answered ``X-Request-ID``
has its RoutingDecision row. ``ulimit -n`` is raised to the hard limit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
    if len(sys.argv) == 5 and sys.argv[1] == "--serve-upstream":
        serve_upstream(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=["wsgi", "asgi"], default="wsgi")
    parser.add_argument("--n", type=int, nargs="+", default=[25, 50, 100])
    parser.add_argument("--max-n", type=int, default=200, help="wsgi; asgi: 2000")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=50, help="wsgi only")
    parser.add_argument("--interval", type=float, default=0.1, help="wsgi only")
    parser.add_argument("--database-url", default="")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="asgi only")
    parser.add_argument("--stream-seconds", type=float, default=30.0, help="asgi only")
    parser.add_argument("--chunks", type=int, default=CHUNKS, help="asgi only")
    parser.add_argument(
        "--ramp-seconds", type=float, default=0.0, help="asgi: spread the N starts (0: at once)"
    )
    parser.add_argument("--gunicorn-timeout", type=int, default=120)
    parser.add_argument("--write", action="store_true", help="update docs/streaming.md")
    args = parser.parse_args()
    if args.server == "asgi":
        run_asgi(args)
        return
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


# --- ASGI: the shipped gunicorn.conf.py, long streams, TTFT against direct ----------------

ASGI_BEGIN = "<!-- stream-concurrency-asgi:begin -->"
ASGI_END = "<!-- stream-concurrency-asgi:end -->"
#: A user message that makes the fake upstream stream at once (warm-up requests).
QUICK = "quick"


def serve_upstream(port: int, chunks: int, seconds: float) -> None:
    """The fake OpenAI upstream of ``--server asgi`` (an asyncio subprocess, keep-alive):
    every stream sends ``chunks`` content pieces (``w0 w1 …``) spread evenly over
    ``seconds``, the first at once; a request whose body holds ``"quick"`` streams
    without pauses."""
    interval = seconds / max(1, chunks - 1)

    def frame(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    def event(delta: dict[str, str], finish: str | None) -> bytes:
        obj = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "fake-stream",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return frame(b"data: " + json.dumps(obj).encode() + b"\n\n")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                pause = 0.0 if f'"{QUICK}"'.encode() in body else interval
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                    + event({"role": "assistant", "content": ""}, None)
                )
                start = loop.time()
                for i in range(chunks):
                    if i and pause:
                        await asyncio.sleep(max(0.0, start + i * pause - loop.time()))
                    writer.write(event({"content": ("" if i == 0 else " ") + f"w{i}"}, None))
                    await writer.drain()
                writer.write(event({}, "stop") + frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


@dataclass
class AsyncOutcome:
    ok: bool
    ttft: float
    duration: float
    error: str = ""
    request_id: str = ""  # X-Request-ID of an answer with status 200


async def a_stream(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: dict[str, object],
    answer: str,
    delay: float,
) -> AsyncOutcome:
    if delay:
        await asyncio.sleep(delay)
    started = time.perf_counter()
    ttft = 0.0
    text: list[str] = []
    done = False
    request_id = ""
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                return AsyncOutcome(False, 0.0, 0.0, f"HTTP {response.status_code}")
            request_id = response.headers.get("x-request-id", "")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    code = str(chunk["error"].get("code"))
                    return AsyncOutcome(False, ttft, 0.0, code, request_id)
                for choice in chunk.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        text.append(content)
                        ttft = ttft or time.perf_counter() - started
    except Exception as exc:
        return AsyncOutcome(False, ttft, 0.0, type(exc).__name__, request_id)
    ok = done and "".join(text) == answer
    duration = time.perf_counter() - started
    return AsyncOutcome(ok, ttft, duration, "" if ok else "text", request_id)


def rss_mib(pids: list[int]) -> dict[int, float]:
    out: dict[int, float] = {}
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                out[pid] = int(line.split()[1]) / 1024
    return out


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry))
    return found


@dataclass
class Level:
    outcomes: list[AsyncOutcome]
    wall: float
    cpu: float  # CPU seconds of the measured server (master + workers) during the level
    peak_rss: dict[int, float]  # worker pid -> peak RSS MiB
    load: float  # 1-minute load average when the level started


async def a_level(
    url: str,
    headers: dict[str, str],
    body: dict[str, object],
    answer: str,
    n: int,
    ramp: float,
    server_pid: int,
    read_timeout: float,
) -> Level:
    limits = httpx.Limits(max_connections=n + 16, max_keepalive_connections=n + 16)
    timeout = httpx.Timeout(connect=60.0, read=read_timeout, write=60.0, pool=120.0)
    workers = children(server_pid)
    peak: dict[int, float] = {}
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            for pid, mib in rss_mib(workers).items():
                peak[pid] = max(peak.get(pid, 0.0), mib)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    load = os.getloadavg()[0]
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        sampler = asyncio.create_task(sample())
        cpu_before = cpu_seconds(server_pid)
        started = time.perf_counter()
        outcomes = await asyncio.gather(
            *(a_stream(client, url, headers, body, answer, ramp * i / n) for i in range(n))
        )
        wall = time.perf_counter() - started
        cpu = cpu_seconds(server_pid) - cpu_before
        stop.set()
        await sampler
    return Level(list(outcomes), wall, cpu, peak, load)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * len(values)) - 1))]


def prepare_asgi_app(args: argparse.Namespace, upstream_port: int) -> str:
    """Migrate, load the provider/chain as config-as-code, clear the decisions, make a
    token (the bench/gateways.py set-up, with a provider timeout above the stream's
    length); the token."""
    from bench.gateways import prepare_app_with

    toml = f"""
[providers.streamer]
kind = "openai_compatible"
model = "fake-stream"
base_url = "http://127.0.0.1:{upstream_port}/v1"
max_retries = 0
supports_streaming = true
timeout_s = {args.stream_seconds + 20:.0f}

[chains.streams]
entries = ["streamer"]
"""
    return prepare_app_with(args, toml)


def decision_rows_for(args: argparse.Namespace, request_ids: list[str]) -> tuple[int, int]:
    """(answered ids that have their RoutingDecision row, all decision rows)."""
    from bench.gateways import app_env

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(request_ids, f)
    code = (
        "import json;from llm_routing.models import RoutingDecision as D;"
        f"ids=json.load(open({f.name!r}));"
        "found=set();"
        "[found.update(str(x) for x in D.objects.filter(request_id__in=ids[i:i+500])"
        ".values_list('request_id',flat=True)) for i in range(0,len(ids),500)];"
        "print(len(found), D.objects.count())"
    )
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=app_env(args, 0),
        check=True,
        capture_output=True,
        text=True,
    )
    os.unlink(f.name)
    found, total = out.stdout.strip().splitlines()[-1].split()
    return int(found), int(total)


def run_asgi(args: argparse.Namespace) -> None:
    import resource

    from bench.gateways import app_env, started

    if not args.database_url.startswith("postgres"):
        raise SystemExit("--server asgi needs --database-url postgres://…")
    if any(n < 1 or n > 2000 for n in args.n):
        raise SystemExit("N must be within 1..2000")
    if not 0 < args.stream_seconds <= 50:
        raise SystemExit("--stream-seconds must be within (0, 50] (REQUEST_DEADLINE_S is 60 s)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * max(args.n) + 1024
    if soft < want:  # the server and the upstream inherit it
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    answer = " ".join(f"w{i}" for i in range(args.chunks))
    up_port, port = free_port(), free_port()
    me = [sys.executable, str(Path(__file__).resolve()), "--serve-upstream"]
    token = prepare_asgi_app(args, up_port)
    body: dict[str, object] = {
        "model": "streams",
        "stream": True,
        "messages": [{"role": "user", "content": "Summarize the quarterly report."}],
    }
    quick = {**body, "messages": [{"role": "user", "content": QUICK}]}
    app_url = f"http://127.0.0.1:{port}/v1/chat/completions"
    direct_url = f"http://127.0.0.1:{up_port}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {token}"}
    read_timeout = args.stream_seconds + 60
    env = app_env(args, port)
    env.pop("GUNICORN_WORKER_CLASS", None)  # the shipped default: uvicorn workers
    env["GUNICORN_TIMEOUT"] = str(args.gunicorn_timeout)
    cmd = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"]
    logs = Path(tempfile.mkdtemp(prefix="stream-asgi-"))
    rows: list[str] = []
    answered_ids: list[str] = []
    with started(
        [*me, str(up_port), str(args.chunks), str(args.stream_seconds)], port=up_port
    ) as upstream:
        with started(cmd, port=port, env=env, log=logs / "gunicorn.log") as server:
            warm = asyncio.run(a_level(app_url, auth, quick, answer, 16, 0.0, server.pid, 60))
            if not all(o.ok for o in warm.outcomes):
                raise SystemExit(f"warm-up failed: {[o for o in warm.outcomes if not o.ok][:3]}")
            answered_ids += [o.request_id for o in warm.outcomes if o.request_id]
            print(f"server: master {server.pid}, workers {children(server.pid)}", flush=True)
            for n in args.n:
                direct = asyncio.run(
                    a_level(
                        direct_url,
                        {},
                        body,
                        answer,
                        n,
                        args.ramp_seconds,
                        upstream.pid,
                        read_timeout,
                    )
                )
                time.sleep(1.0)
                app = asyncio.run(
                    a_level(
                        app_url,
                        auth,
                        body,
                        answer,
                        n,
                        args.ramp_seconds,
                        server.pid,
                        read_timeout,
                    )
                )
                answered_ids += [o.request_id for o in app.outcomes if o.request_id]
                for label, level in (("direct", direct), ("this app (ASGI)", app)):
                    rows.append(asgi_row(label, n, level, direct))
                    print(rows[-1], flush=True)
                time.sleep(1.0)
        # The graceful stop (SIGTERM) above flushed the write-behind queue.
    found, total = decision_rows_for(args, answered_ids)
    invariant = (
        f"{found} of {len(answered_ids)} answered request ids (warm-ups included) have "
        f"their RoutingDecision row ({total} rows in all), counted after a graceful stop."
    )
    print(invariant)
    ramp = (
        "all N requests sent at once"
        if not args.ramp_seconds
        else f"the N starts spread evenly over {args.ramp_seconds:g} s"
    )
    table = "\n".join(
        [
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
            f"{platform.machine()} / Python {platform.python_version()}, {os.cpu_count()} CPUs "
            "shared with the load generator (one asyncio process, httpx), the fake upstream "
            "and other engineers' work: `gunicorn -c gunicorn.conf.py` as shipped (uvicorn "
            f"workers, `WEB_CONCURRENCY={args.workers}`), PostgreSQL, Redis, "
            "`LLM_ROUTING_RECORD_MODE=write_behind`; every stream "
            f"{args.chunks} content chunks spread over {args.stream_seconds:g} s (the first "
            f'at once); {ramp}; "direct" = the same client straight to the same fake '
            "upstream, just before (its server CPU: the fake upstream's). TTFT = request "
            "sent → first content chunk read.",
            "",
            "| streams | path | completed (exact text + `[DONE]`) | errors | TTFT p50 ms "
            "| TTFT p99 ms | TTFT overhead p50 / p99 ms | median stream s | wall s "
            "| server CPU s | peak RSS per worker MiB | load avg (1 min) |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            invariant,
        ]
    )
    print()
    print(table)
    if args.write:
        path = ROOT / "docs" / "streaming.md"
        replace_docs_section(
            path,
            ASGI_BEGIN,
            f"{ASGI_END}",
            f"{ASGI_BEGIN}\n{table}\n{ASGI_END}",
            append_if_missing=False,
        )


def asgi_row(label: str, n: int, level: Level, direct: Level) -> str:
    ok = [o for o in level.outcomes if o.ok]
    errors: dict[str, int] = {}
    for o in level.outcomes:
        if not o.ok:
            errors[o.error] = errors.get(o.error, 0) + 1
    failed = f"{n - len(ok)}" + (
        " (" + ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) + ")" if errors else ""
    )
    ttft = [o.ttft * 1000 for o in ok]
    base = [o.ttft * 1000 for o in direct.outcomes if o.ok]
    p50, p99 = pct(ttft, 0.5), pct(ttft, 0.99)
    overhead = (
        "baseline"
        if level is direct
        else f"{p50 - pct(base, 0.5):+.1f} / {p99 - pct(base, 0.99):+.1f}"
    )
    rss = (
        ", ".join(f"{v:.0f}" for v in sorted(level.peak_rss.values())) if label != "direct" else "—"
    )
    durations = [o.duration for o in ok] or [0.0]
    return (
        f"| {n} | {label} | {len(ok)}/{n} | {failed} | {p50:.1f} | {p99:.1f} | {overhead} "
        f"| {statistics.median(durations):.2f} | {level.wall:.2f} | {level.cpu:.2f} "
        f"| {rss} | {level.load:.2f} |"
    )


if __name__ == "__main__":
    main()
