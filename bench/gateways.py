"""Side-by-side gateway benchmark: this app as the shipped gunicorn.conf.py serves it
("this app (ASGI)": uvicorn workers, the default) and with
``GUNICORN_WORKER_CLASS=gthread`` ("this app (WSGI)"), the LiteLLM proxy and the
Portkey gateway, against the same fake OpenAI-format upstream,
on loopback only, in one run.

    .venv/bin/python bench/gateways.py \
        --database-url postgres://postgres@127.0.0.1:5432/llm_routing_gateways \
        --redis-url redis://127.0.0.1:6379/0 --write-docs

Measured per system (``/v1/chat/completions``, non-stream unless said):

* added p50 at c=1 over the direct upstream (0 ms upstream);
* req/s at c=1 / 16 / 64 (0 ms upstream);
* % of direct throughput at 256 and 1,000 clients against a 1 s upstream, and errors;
* TTFT overhead of a stream (first content byte, c=1) over the direct upstream;
* RSS per worker after the run;
* for this app: decisions written == requests answered (counted in PostgreSQL).

Load comes from ``wrk`` (Debian package ``wrk``); every run is bounded in time. Peers
are installed on first use into ``bench/.peers/`` (not committed) from
``--peers-dir`` (``package.json`` / ``package-lock.json`` / ``start-local.mjs`` for
Portkey, ``requirements-litellm-proxy.txt`` for LiteLLM). A system whose install or
start fails is reported as such in the table, never silently dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEERS_CACHE = ROOT / "bench" / ".peers"
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- gateways:begin -->"
END = "<!-- gateways:end -->"
PROMPT = "Summarize: the quarterly report shows revenue up 4% on strong demand."
BODY = {"model": "fast", "messages": [{"role": "user", "content": PROMPT}]}


# --- the fake upstream (a subprocess: --serve-upstream PORT DELAY_S) -------------------


def serve_upstream(port: int, delay_s: float) -> None:
    """A minimal asyncio HTTP/1.1 server speaking OpenAI chat completions (keep-alive,
    non-stream and SSE): cheap enough per request that it never is the bottleneck."""
    answer = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": "fake-fast",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Revenue rose 4%."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
        }
    ).encode()

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        obj = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "fake-fast",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                stream = b'"stream": true' in body or b'"stream":true' in body
                if delay_s:
                    await asyncio.sleep(delay_s)
                if not stream:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: " + str(len(answer)).encode() + b"\r\n\r\n" + answer
                    )
                    await writer.drain()
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                frames = [chunk({"role": "assistant", "content": ""}, None)]
                frames += [chunk({"content": w + " "}, None) for w in "Revenue rose 4%.".split()]
                frames += [chunk({}, "stop"), b"data: [DONE]\n\n"]
                for frame in frames:
                    writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# --- processes ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


@contextlib.contextmanager
def started(
    cmd: list[str],
    *,
    port: int,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    log: Path | None = None,
    start_timeout: float = 60.0,
) -> Iterator[subprocess.Popen[bytes]]:
    out = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_port(port, start_timeout)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if log:
            out.close()  # type: ignore[union-attr]


def rss_mib_of_children(pid: int) -> float | None:
    """The largest RSS among the process group's members (the workers), MiB."""
    sizes: list[int] = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
            pgid = os.getpgid(int(status.parent.name))
        except (OSError, ProcessLookupError):
            continue
        if pgid != pid:
            continue
        match = re.search(r"VmRSS:\s+(\d+) kB", text)
        if match:
            sizes.append(int(match.group(1)))
    return max(sizes) / 1024 if sizes else None


def worker_cpu(pgid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each process of the group but its leader (the
    gunicorn master, granian's or a peer's launcher): the workers; the leader alone when
    it has none (a one-process server)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields[2]: the process group
            out[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / tick
    if len(out) > 1:
        out.pop(pgid, None)
    return out


@dataclass
class CpuSplit:
    """Each worker's share of the workers' CPU during one run, and CPU per request."""

    shares: list[float] = field(default_factory=list)
    ms_per_request: float = 0.0

    def __str__(self) -> str:
        if not self.shares:
            return "—"
        split = " + ".join(f"{s:.0f} %" for s in sorted(self.shares, reverse=True))
        return f"{split} ({self.ms_per_request:.2f} ms/req)"


def cpu_during(pgid: int | None, run: Callable[[], Run]) -> tuple[Run, CpuSplit]:
    """``run()`` and the workers' CPU it cost (shares of the total, ms per request)."""
    if pgid is None:
        return run(), CpuSplit()
    before = worker_cpu(pgid)
    result = run()
    after = worker_cpu(pgid)
    used = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    total = sum(used.values())
    if total <= 0:
        return result, CpuSplit()
    shares = [100.0 * u / total for u in used.values() if u > 0 or len(used) > 1]
    return result, CpuSplit(shares, 1000.0 * total / max(1, result.requests))


# --- load --------------------------------------------------------------------------------


@dataclass
class Run:
    requests: int = 0
    rps: float = 0.0
    p50_ms: float = 0.0
    errors: int = 0


WRK_LUA = """
wrk.method = "POST"
wrk.body = [[{body}]]
{headers}
"""


#: wrk's threads (``--wrk-threads``): 1 by default, as the issue's harness ran it. Two
#: threads open their connections in two bursts, which happened to spread them over
#: the workers of a shared socket (docs/benchmarks.md, "Why the figures disagreed").
WRK_THREADS = 1


def wrk(
    url: str, headers: dict[str, str], body: dict[str, Any], *, connections: int, seconds: int
) -> Run:
    """One bounded wrk run; errors = non-2xx answers + socket errors (timeouts included)."""
    lines = [
        f'wrk.headers["{k}"] = "{v}"'
        for k, v in {"Content-Type": "application/json", **headers}.items()
    ]
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_LUA.format(body=json.dumps(body), headers="\n".join(lines)))
    threads = max(1, min(WRK_THREADS, connections))
    cmd = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{seconds}s",
        "--timeout",
        "10s",
        "--latency",
        "-s",
        script.name,
        url,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    os.unlink(script.name)
    if os.environ.get("GATEWAYS_DEBUG"):
        print(" ".join(cmd), "\n", out, flush=True)
    run = Run()
    if m := re.search(r"(\d+) requests in", out):
        run.requests = int(m.group(1))
    if m := re.search(r"Requests/sec:\s+([\d.]+)", out):
        run.rps = float(m.group(1))
    if m := re.search(r"\s50%\s+([\d.]+)(us|ms|s)", out):
        run.p50_ms = float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        run.errors += int(m.group(1))
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        run.errors += sum(int(g) for g in m.groups())
    return run


def warm_up(url: str, headers: dict[str, str], body: dict[str, Any], *, count: int = 8) -> None:
    """A few requests before measuring: lazy imports, pools and workers' first hits."""
    import httpx

    with httpx.Client(timeout=30) as client:
        for _ in range(count):
            response = client.post(url, json=body, headers=headers)
            if response.status_code != 200:
                raise RuntimeError(f"warm-up answered HTTP {response.status_code}")


def alternating_added_ms(
    url: str, headers: dict[str, str], body: dict[str, Any], direct_url: str, *, samples: int
) -> float:
    """The second harness: a Python client (httpx, one keep-alive connection to each side)
    alternating a request through the gateway and one straight to the upstream, c=1; the
    gateway's p50 minus the direct p50. The client's own cost lands on both sides, so the
    difference is comparable with wrk's (which subtracts separate runs)."""
    import httpx

    through: list[float] = []
    straight: list[float] = []
    with httpx.Client(timeout=30) as gw, httpx.Client(timeout=30) as up:
        for _ in range(samples):
            for client, target, hdrs, data, times in (
                (gw, url, headers, body, through),
                (up, direct_url, {}, BODY, straight),
            ):
                started_at = time.perf_counter()
                response = client.post(target, json=data, headers=hdrs)
                times.append((time.perf_counter() - started_at) * 1000)
                if response.status_code != 200:
                    raise RuntimeError(f"alternating client: HTTP {response.status_code}")
    through.sort()
    straight.sort()
    return through[len(through) // 2] - straight[len(straight) // 2]


def ttft_ms(url: str, headers: dict[str, str], *, samples: int) -> float:
    """Median time to the first content chunk of a streamed answer (c=1)."""
    import httpx

    body = {**BODY, "stream": True}
    times: list[float] = []
    with httpx.Client(timeout=30) as client:
        for _ in range(samples):
            started_at = time.perf_counter()
            with client.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"stream answered HTTP {response.status_code}")
                seen = False
                for line in response.iter_lines():  # read to the end: keep-alive reuse
                    if not seen and ('"content": "R' in line or '"content":"R' in line):
                        times.append((time.perf_counter() - started_at) * 1000)
                        seen = True
    times.sort()
    return times[len(times) // 2] if times else float("nan")


# --- systems -----------------------------------------------------------------------------


@dataclass
class System:
    name: str
    url: str = ""  # the chat-completions URL
    headers: dict[str, str] = field(default_factory=dict)
    model_fast: str = "fast"
    model_slow: str = "slow"
    note: str = ""


def app_env(args: argparse.Namespace, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(48),
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "CONN_MAX_AGE": "60",
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        "WEB_CONCURRENCY": str(args.workers),
        "GUNICORN_ACCESSLOG": "",
        "LLM_ROUTING_USER_RATE": "100000000/min",
        "LLM_ROUTING_LOG_LEVEL": "WARNING",
        # Production settings (docs/production.md): decisions written off the request
        # path in batches, anything the database refuses kept in the spool.
        "LLM_ROUTING_RECORD_MODE": getattr(args, "record_mode", "inline"),
        "LLM_ROUTING_SPOOL_DIR": str(Path(tempfile.gettempdir()) / "llm-routing-bench-spool"),
    }


def prepare_app(args: argparse.Namespace, fast_port: int, slow_port: int) -> str:
    """Migrate, load the providers/chains as config-as-code, make a token; the token."""
    toml = f"""
[providers.fast]
kind = "openai_compatible"
model = "fake-fast"
base_url = "http://127.0.0.1:{fast_port}/v1"
max_retries = 0
supports_streaming = true

[providers.slow]
kind = "openai_compatible"
model = "fake-slow"
base_url = "http://127.0.0.1:{slow_port}/v1"
max_retries = 0
supports_streaming = true

[chains.fast]
entries = ["fast"]

[chains.slow]
entries = ["slow"]
"""
    return prepare_app_with(args, toml)


def prepare_app_with(args: argparse.Namespace, toml: str) -> str:
    """Migrate, apply ``toml`` as config-as-code (``--prune``), clear the decisions,
    make the bench user's token; the token."""
    env = app_env(args, 0)
    py = sys.executable
    subprocess.run([py, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(toml)
    subprocess.run(
        [py, "manage.py", "llm_routing_apply", f.name, "--prune"],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    os.unlink(f.name)
    code = (
        "from django.contrib.auth import get_user_model;"
        "from rest_framework.authtoken.models import Token;"
        "from llm_routing.models import RoutingDecision;"
        "RoutingDecision.objects.all().delete();"
        "u,_=get_user_model().objects.get_or_create(username='bench');"
        "print(Token.objects.get_or_create(user=u)[0].key)"
    )
    out = subprocess.run(
        [py, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def decisions(args: argparse.Namespace) -> int:
    env = app_env(args, 0)
    code = "from llm_routing.models import RoutingDecision;print(RoutingDecision.objects.count())"
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.strip().splitlines()[-1])


def install_litellm(peers: Path) -> Path:
    venv = PEERS_CACHE / "litellm"
    exe = venv / "bin" / "litellm"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [
                str(venv / "bin" / "pip"),
                "install",
                "-q",
                "-r",
                str(peers / "requirements-litellm-proxy.txt"),
            ],
            check=True,
        )
    return exe


def install_portkey(peers: Path) -> Path:
    folder = PEERS_CACHE / "portkey"
    if not (folder / "node_modules").exists():
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json", "start-local.mjs"):
            shutil.copy(peers / name, folder / name)
        subprocess.run(
            ["npm", "ci", "--ignore-scripts", "--silent"],
            cwd=folder,
            check=True,
        )
    return folder


# --- the run -----------------------------------------------------------------------------


@dataclass
class Row:
    system: str
    added_p50_ms: float | None = None
    added_p50_py_ms: float | None = None  # the second harness (alternating Python client)
    rps: dict[int, float] = field(default_factory=dict)
    pct_direct: dict[int, tuple[float, int]] = field(default_factory=dict)
    ttft_overhead_ms: float | None = None
    rss_mib: float | None = None
    decisions_ok: str = "n/a"
    note: str = ""
    answered: int = 0  # 2xx answers the client saw (wrk runs, warm-ups, stream samples)
    cpu: dict[int, CpuSplit] = field(default_factory=dict)  # by connections (c=1, c=16)
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after


def measure(
    system: System,
    args: argparse.Namespace,
    direct: Row | None,
    pid: int | None,
    fast_url: str,
    slow_url: str,
) -> Row:
    row = Row(system=system.name, note=system.note)
    body_fast = {**BODY, "model": system.model_fast}
    body_slow = {**BODY, "model": system.model_slow}
    secs = args.seconds
    warm_up(fast_url, system.headers, body_fast)
    warm_up(slow_url, system.headers, body_slow)
    runs: list[Run] = []
    load_before = os.getloadavg()[0]
    c1, row.cpu[1] = cpu_during(
        pid, lambda: wrk(fast_url, system.headers, body_fast, connections=1, seconds=secs)
    )
    runs.append(c1)
    row.added_p50_ms = c1.p50_ms if direct is None else c1.p50_ms - direct.rps.get(-1, 0.0)
    row.rps[-1] = c1.p50_ms  # kept for the direct row's baseline
    if direct is not None and args.python_client_samples:
        row.added_p50_py_ms = alternating_added_ms(
            fast_url,
            system.headers,
            body_fast,
            args.direct_fast_url,
            samples=args.python_client_samples,
        )
        row.answered += args.python_client_samples
    row.rps[1] = c1.rps
    for c in (16, 64):
        run_c, split = cpu_during(
            pid,
            lambda c=c: wrk(  # type: ignore[misc]
                fast_url, system.headers, body_fast, connections=c, seconds=secs
            ),
        )
        runs.append(run_c)
        row.rps[c] = run_c.rps
        if c == 16:
            row.cpu[16] = split
    for c in args.slow_clients:
        run = wrk(slow_url, system.headers, body_slow, connections=c, seconds=max(secs, 10))
        runs.append(run)
        base = direct.pct_direct.get(c, (run.rps, 0))[0] if direct else run.rps
        row.pct_direct[c] = (run.rps if direct is None else 100.0 * run.rps / base, run.errors)
    try:
        t = ttft_ms(fast_url, system.headers, samples=args.ttft_samples)
    except RuntimeError as exc:  # shown in the table: a peer that cannot stream here
        t = float("nan")
        row.note = "; ".join(filter(None, [row.note, str(exc)]))
    row.answered += (
        16 + (0 if t != t else args.ttft_samples) + sum(max(0, r.requests - r.errors) for r in runs)
    )
    row.ttft_overhead_ms = t if direct is None else t - (direct.ttft_overhead_ms or 0.0)
    if pid is not None:
        row.rss_mib = rss_mib_of_children(pid)
    row.load = (load_before, os.getloadavg()[0])
    return row


def table(rows: list[Row], args: argparse.Namespace) -> str:
    slow = args.slow_clients
    head = (
        "| system | added p50 c=1 (ms) | added p50 c=1, Python client (ms) "
        "| req/s c=1 / 16 / 64 | "
        + " | ".join(f"{c} clients, 1 s upstream: % direct (errors)" for c in slow)
        + " | TTFT overhead (ms) | RSS/worker (MiB) | decision rows / 2xx answers"
        + " | worker CPU c=1 | worker CPU split c=16 | load avg before → after |"
    )
    sep = "|" + "---|" * (10 + len(slow))
    out = [head, sep]
    for r in rows:
        is_direct = r.system == "direct"
        pct = " | ".join(
            (
                f"{r.pct_direct[c][0]:.0f} req/s"
                if is_direct
                else f"{r.pct_direct[c][0]:.0f} % ({r.pct_direct[c][1]})"
            )
            if c in r.pct_direct
            else "—"
            for c in slow
        )
        added = (
            "0 (baseline)"
            if is_direct
            else (f"+{r.added_p50_ms:.2f}" if r.added_p50_ms is not None else "—")
        )
        added_py = (
            "0 (baseline)"
            if is_direct
            else (f"+{r.added_p50_py_ms:.2f}" if r.added_p50_py_ms is not None else "—")
        )
        rps = " / ".join(f"{r.rps.get(c, 0):.0f}" for c in (1, 16, 64)) if r.rps else "—"
        ttft = (
            "baseline"
            if is_direct
            else (
                f"+{r.ttft_overhead_ms:.2f}"
                if r.ttft_overhead_ms is not None and r.ttft_overhead_ms == r.ttft_overhead_ms
                else "—"
            )
        )
        rss = f"{r.rss_mib:.0f}" if r.rss_mib else "—"
        name = r.system + (f" ({r.note})" if r.note else "")
        c1 = f"{r.cpu[1].ms_per_request:.2f} ms/req" if r.cpu.get(1) and r.cpu[1].shares else "—"
        split = str(r.cpu.get(16, CpuSplit()))
        load = f"{r.load[0]:.1f} → {r.load[1]:.1f}" if any(r.load) else "—"
        out.append(
            f"| {name} | {added} | {added_py} | {rps} "
            f"| {pct + ' | ' if slow else ''}{ttft} | {rss} "
            f"| {r.decisions_ok} "
            f"| {c1} | {split} | {load} |"
        )
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-upstream":
        serve_upstream(int(sys.argv[2]), float(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--systems", default="direct,lane,django,wsgi,litellm,portkey")
    parser.add_argument(
        "--wrk-threads", type=int, default=1, help="wrk threads (the issue's harness: 1)"
    )
    parser.add_argument(
        "--record-mode",
        default="inline",
        help="LLM_ROUTING_RECORD_MODE of this app (default: inline, the shipped default)",
    )
    parser.add_argument("--peers-dir", type=Path, default=ROOT.parent / "shared" / "peers")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=10, help="length of each wrk run")
    parser.add_argument(
        "--slow-clients", type=lambda s: [int(x) for x in s.split(",") if x], default=[256, 1000]
    )
    parser.add_argument("--ttft-samples", type=int, default=50)
    parser.add_argument(
        "--python-client-samples",
        type=int,
        default=500,
        help="requests per side of the alternating Python-client harness (0: skip it)",
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install wrk")
    global WRK_THREADS
    WRK_THREADS = args.wrk_threads
    wanted = args.systems.split(",")
    load_start = os.getloadavg()[0]
    fast_port, slow_port = free_port(), free_port()
    me = [sys.executable, str(Path(__file__).resolve()), "--serve-upstream"]
    rows: list[Row] = []
    logs = Path(tempfile.mkdtemp(prefix="gateways-"))
    with (
        started([*me, str(fast_port), "0"], port=fast_port),
        started([*me, str(slow_port), "1"], port=slow_port),
    ):
        up_fast = f"http://127.0.0.1:{fast_port}/v1/chat/completions"
        args.direct_fast_url = up_fast
        up_slow = f"http://127.0.0.1:{slow_port}/v1/chat/completions"
        direct = measure(System("direct"), args, None, None, up_fast, up_slow)
        rows.append(direct)
        for name in wanted:
            if name == "direct":
                continue
            port = free_port()
            try:
                row = run_system(name, port, args, direct, fast_port, slow_port, logs)
            except Exception as exc:  # reported in the table, never silently dropped
                row = Row(system=name, note=f"not measured: {type(exc).__name__}: {exc}"[:160])
            rows.append(row)
            print(table(rows, args), flush=True)
    text = table(rows, args)
    print(text)
    if args.write_docs:
        from common import replace_docs_section  # type: ignore[import-not-found]

        block = (
            f"{BEGIN}\n## Gateways side by side (`bench/gateways.py`)\n\n"
            f"One run, {time.strftime('%Y-%m-%d %H:%M UTC')}, this 2-core machine, 1-minute "
            f"load average {load_start:.1f} at the start"
            f"{' (under load: see the last column)' if load_start > 1.5 else ''}, wrk on loopback, "
            f"{args.workers} workers per system where it has workers, {args.seconds} s per "
            f"level, wrk with {args.wrk_threads} thread(s), records {args.record_mode}; % of "
            f"direct = req/s through the gateway / req/s straight to the 1 s upstream at the "
            f"same client count; worker CPU from /proc (user + system of each worker) over "
            f"the c=1 and c=16 runs.\n\n{text}\n{END}"
        )
        replace_docs_section(DOCS, BEGIN, END, block)


#: ``--systems`` name → (table label, environment over the shipped gunicorn.conf.py)
APP_VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "lane": ("this app, lean lane (ASGI)", {}),
    "django": (
        "this app, Django path (ASGI)",
        {"GUNICORN_APP": "project.asgi:django_application"},
    ),
    "lane-shared-socket": (
        "this app, lean lane, one shared socket",
        {"GUNICORN_REUSE_PORT": "false"},
    ),
    "django-shared-socket": (
        "this app, Django path, one shared socket",
        {"GUNICORN_APP": "project.asgi:django_application", "GUNICORN_REUSE_PORT": "false"},
    ),
    "wsgi": ("this app (WSGI)", {"GUNICORN_WORKER_CLASS": "gthread"}),
}
APP_VARIANTS["asgi"] = APP_VARIANTS["lane"]  # the name earlier runs used


def run_system(
    name: str,
    port: int,
    args: argparse.Namespace,
    direct: Row,
    fast_port: int,
    slow_port: int,
    logs: Path,
) -> Row:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    if name in APP_VARIANTS:
        token = prepare_app(args, fast_port, slow_port)
        env = {**app_env(args, port), **APP_VARIANTS[name][1]}
        cmd = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"]  # the shipped config
        system = System(APP_VARIANTS[name][0], headers={"Authorization": f"Bearer {token}"})
        with started(cmd, port=port, env=env, log=logs / f"{name}.log") as proc:
            row = measure(system, args, direct, proc.pid, url, url)
        # Counted after a graceful stop, which flushes the write-behind queue. wrk stops
        # counting at its deadline while the server may still finish (and record) the
        # requests in flight: rows >= answers, rows - answers <= clients.
        rows = decisions(args)
        row.decisions_ok = f"{rows} rows / {row.answered} answers"
        return row
    if name == "litellm":
        exe = install_litellm(args.peers_dir)
        key = "sk-bench-" + secrets.token_hex(8)
        config = logs / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            f"  - model_name: fast\n    litellm_params: {{model: openai/fake-fast, "
            f"api_base: 'http://127.0.0.1:{fast_port}/v1', api_key: x}}\n"
            f"  - model_name: slow\n    litellm_params: {{model: openai/fake-slow, "
            f"api_base: 'http://127.0.0.1:{slow_port}/v1', api_key: x}}\n"
        )
        env = {
            **os.environ,
            "LITELLM_MASTER_KEY": key,
            "LITELLM_OFFLINE_MODE": "true",
            "LITELLM_LOG": "ERROR",
        }
        cmd = [
            str(exe),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            str(args.workers),
        ]
        system = System(name, headers={"Authorization": f"Bearer {key}"})
        with started(cmd, port=port, env=env, log=logs / "litellm.log", start_timeout=300) as proc:
            return measure(system, args, direct, proc.pid, url, url)
    if name == "portkey":
        folder = install_portkey(args.peers_dir)
        cmd = ["node", "start-local.mjs", f"--port={port}", "--headless"]
        # Portkey routes by headers; "fast" and "slow" are two custom hosts.
        fast = System(
            name,
            note="1 process",
            headers={
                "x-portkey-provider": "openai",
                "Authorization": "Bearer x",
                "x-portkey-custom-host": f"http://127.0.0.1:{fast_port}/v1",
            },
            model_fast="fake-fast",
            model_slow="fake-slow",
        )
        with started(cmd, port=port, cwd=folder, log=logs / "portkey.log") as proc:
            row = measure(fast, args, direct, proc.pid, url, url)
            slow_headers = {
                **fast.headers,
                "x-portkey-custom-host": f"http://127.0.0.1:{slow_port}/v1",
            }
            for c in args.slow_clients:
                run = wrk(
                    url,
                    slow_headers,
                    {**BODY, "model": "fake-slow"},
                    connections=c,
                    seconds=max(args.seconds, 10),
                )
                row.pct_direct[c] = (100.0 * run.rps / direct.pct_direct[c][0], run.errors)
            return row
    raise ValueError(f"unknown system {name!r}")


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
