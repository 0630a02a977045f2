"""Benchmark: sequential requests with a dead primary, circuit breaker on vs. off,
against a healthy single-provider chain.

    .venv/bin/python bench/breaker_dead_primary.py [--requests 1000] [--no-breaker 100]
                                                   [--redis redis://127.0.0.1:6379/4]

Upstreams are local HTTP servers (tests/breaker_support.py); the dead one answers 503.
Each provider keeps the default max_retries=2 and the real backoff sleeps. Requests are
routed with ``persist=False`` (routing cost only, no log rows). Prints a Markdown table;
results are kept in docs/benchmarks-breaker.md.

``--server asgi`` / ``--server wsgi`` (repeatable) measures the dead primary across
worker processes instead: ``gunicorn -c gunicorn.conf.py`` as shipped (uvicorn workers;
``GUNICORN_WORKER_CLASS=gthread`` for wsgi), ``--workers`` per server, ``--instances``
servers, all on one Redis (circuits) and one PostgreSQL, configured as
``bench/gateways.py`` configures the app; the chain is [dead (503), healthy] as
config-as-code. ``--clients`` concurrent clients send ``POST /v1/chat/completions``
round-robin over the servers for ``--seconds``. The dead upstream records the time of
every request it receives, and the servers log (INFO) each (re)opening of the circuit
with its cooldown and each call that claims the half-open probe slot. A half-open
moment is the end of a cooldown; per moment (until the next one) the table gives the
probes claimed (from the logs: 1 is the target; a second one is a probe sent while the
circuit is open again) and the calls that reached the dead primary (from the
upstream: a call that is no probe, e.g. the retry of a call admitted before the circuit
opened, shows as the difference)::

    .venv/bin/python bench/breaker_dead_primary.py --server asgi --server wsgi \
        --database-url postgres://postgres@127.0.0.1:5432/llmr_i14 \
        --redis-url redis://127.0.0.1:6379/0 --seconds 30 --clients 4
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
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
    parser.add_argument("--server", action="append", choices=["asgi", "wsgi"], default=[])
    parser.add_argument("--database-url", default="")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--pace", type=float, default=0.0, help="sleep between requests")
    args = parser.parse_args()
    if args.server:
        if not args.database_url.startswith("postgres"):
            raise SystemExit("--server needs --database-url postgres://…")
        with tempfile.TemporaryDirectory() as tmp:
            setup(str(Path(tmp) / "bench.sqlite3"))  # this process: the fake upstream only
            rows = [server_scenario(kind, args) for kind in args.server]
        for r in rows:
            print(r["label"], "dead-primary hits (s):", " ".join(f"{h:.2f}" for h in r["hits"]))
            print(" half-open moments (s):", " ".join(f"{s['at']:.2f}" for s in r["steps"]))
        print(server_table(rows))
        return
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


# --- across worker processes: the shipped gunicorn config ---------------------------------


def server_scenario(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    import secrets
    import subprocess
    import threading

    import httpx

    sys.path.insert(0, str(ROOT / "bench"))
    import http.server

    from gateways import app_env, free_port, started  # type: ignore[import-not-found]

    from tests.breaker_support import FakeUpstream

    # socketserver listens with a backlog of 5: with many clients, dropped SYNs would
    # hold calls for 1-3 s retransmits and bring them to the dead primary late.
    http.server.ThreadingHTTPServer.request_queue_size = 256

    tag = secrets.token_hex(3)  # fresh circuit keys in the shared Redis for every run
    dead_name, healthy_name = f"dead-{tag}", f"healthy-{tag}"
    healthy_port = free_port()
    me = [sys.executable, str(ROOT / "bench" / "gateways.py"), "--serve-upstream"]
    ports = [free_port() for _ in range(args.instances)]
    env0 = app_env(args, 0)
    with (
        FakeUpstream(status=503) as dead,
        started([*me, str(healthy_port), "0"], port=healthy_port),
        tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as toml,
    ):
        toml.write(
            f"""
[providers.{dead_name}]
kind = "openai_compatible"
model = "fake-dead"
base_url = "{dead.url}/v1"
max_retries = 2

[providers.{healthy_name}]
kind = "openai_compatible"
model = "fake-fast"
base_url = "http://127.0.0.1:{healthy_port}/v1"
max_retries = 2

[chains.bench]
entries = ["{dead_name}", "{healthy_name}"]

[chains.warm]
entries = ["{healthy_name}"]
"""
        )
        toml.close()
        py = sys.executable
        run = {"cwd": ROOT, "env": env0, "check": True}
        subprocess.run([py, "manage.py", "migrate", "--noinput", "-v0"], **run)
        subprocess.run(
            [py, "manage.py", "llm_routing_apply", toml.name, "--prune"],
            stdout=subprocess.DEVNULL,
            **run,
        )
        os.unlink(toml.name)
        code = (
            "from django.contrib.auth import get_user_model;"
            "from rest_framework.authtoken.models import Token;"
            "u,_=get_user_model().objects.get_or_create(username='bench');"
            "print(Token.objects.get_or_create(user=u)[0].key)"
        )
        out = subprocess.run(
            [py, "manage.py", "shell", "-c", code], capture_output=True, text=True, **run
        )
        token = out.stdout.strip().splitlines()[-1]
        headers = {"Authorization": f"Bearer {token}"}
        body = {"model": "bench", "messages": [{"role": "user", "content": "hello"}]}
        logs: list[Path] = []
        with contextlib.ExitStack() as stack:
            masters = []
            for port in ports:
                # INFO: the breaker names each probe claim and each (re)opening.
                env = {**app_env(args, port), "LLM_ROUTING_LOG_LEVEL": "INFO"}
                if kind == "wsgi":
                    env["GUNICORN_WORKER_CLASS"] = "gthread"
                cmd = [py, "-m", "gunicorn", "-c", "gunicorn.conf.py"]
                log = Path(tempfile.gettempdir()) / f"breaker-{kind}-{port}.log"
                logs.append(log)
                masters.append(stack.enter_context(started(cmd, port=port, env=env, log=log)))
            urls = [f"http://127.0.0.1:{port}/v1/chat/completions" for port in ports]
            with httpx.Client(timeout=30) as warm:  # every worker imports and connects
                for i in range(8 * args.workers * args.instances):
                    r = warm.post(
                        urls[i % len(urls)], json={**body, "model": "warm"}, headers=headers
                    )
                    r.raise_for_status()
            cpu_before = sum(_tree_cpu(m.pid) for m in masters)
            dead.hits.clear()
            served: dict[str, int] = {}
            errors: list[str] = []
            lock = threading.Lock()
            started_at = time.time()
            deadline = time.monotonic() + args.seconds

            def client(index: int) -> None:
                with httpx.Client(timeout=30) as http:
                    i = index
                    while time.monotonic() < deadline:
                        try:
                            r = http.post(urls[i % len(urls)], json=body, headers=headers)
                            provider = r.headers.get("X-LLM-Provider", f"HTTP {r.status_code}")
                        except httpx.HTTPError as exc:
                            provider = type(exc).__name__
                        with lock:
                            served[provider] = served.get(provider, 0) + 1
                            if provider not in (dead_name, healthy_name):
                                errors.append(provider)
                        i += 1
                        if args.pace:
                            time.sleep(args.pace)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.time() - started_at
            cpu = sum(_tree_cpu(m.pid) for m in masters) - cpu_before
        hits = sorted(h - started_at for h in dead.hits)
    openings, probes = _breaker_events(logs, dead_name, started_at)
    # Half-open moment k: when the k-th (re)opening's cooldown ends. A step runs from one
    # such moment to the next: its first probe claim is the probe, any other claim in
    # it (even one made while the circuit is open again) is an extra probe. The
    # "opened" line is logged a few ms after the cooldown started (the observing call's
    # clock reading, then two cache round trips): moments start LOG_LAG_S early.
    moments = [at + cooldown - LOG_LAG_S for at, cooldown in openings]
    bounds = [*moments, float("inf")]
    steps = [
        {
            "at": bounds[k],
            "probes": sum(bounds[k] <= t < bounds[k + 1] for t in probes),
            "hits": sum(bounds[k] <= t < bounds[k + 1] for t in hits),
        }
        for k in range(len(moments))
        if bounds[k] <= wall  # a moment after the run's end had no traffic
    ]
    return {
        "label": f"{kind}: {args.instances} x gunicorn -c gunicorn.conf.py, "
        f"{args.workers} workers each",
        "clients": args.clients,
        "requests": sum(served.values()),
        "served": {k.split("-")[0] if "-" in k else k: v for k, v in served.items()},
        "hits": hits,
        "opened_at": openings[0][0] if openings else None,
        "before_probe": sum(t < (moments[0] if moments else float("inf")) for t in hits),
        "steps": steps,
        "wall": wall,
        "cpu": cpu,
        "load": os.getloadavg()[0],
    }


#: Below the smallest cooldown step (1 s), above the log lines' lag behind the clock.
LOG_LAG_S = 0.25
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ \S+ \[[^\]]*\] (.*)$")


def _breaker_events(
    logs: list[Path], provider: str, origin: float
) -> tuple[list[tuple[float, float]], list[float]]:
    """([(time the circuit (re)opened, its cooldown s)], [times a call claimed the probe
    slot]), seconds after ``origin``, from the servers' logs (the breaker's lines)."""
    from datetime import UTC, datetime

    openings: list[tuple[float, float]] = []
    probes: list[float] = []
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            m = LOG_LINE.match(line)
            if not m or f"Circuit {provider}/" not in m.group(2):
                continue
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
            t = at.timestamp() - origin
            if "this call is the probe" in m.group(2):
                probes.append(t)
            elif opened := re.search(r" opened for ([\d.]+)s ", m.group(2)):
                openings.append((t, float(opened.group(1))))
    return sorted(openings), sorted(probes)


def _children(pid: int) -> list[int]:
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


def _tree_cpu(master: int) -> float:
    """CPU seconds of a gunicorn master, its live workers and the workers it reaped
    (``max_requests`` recycles workers during a run)."""

    def fields(pid: int) -> list[str]:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return ["0"] * 20
        return stat[stat.rindex(")") + 2 :].split()

    mine = fields(master)
    ticks = sum(int(mine[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    ticks += sum(int(fields(pid)[11]) + int(fields(pid)[12]) for pid in _children(master))
    return ticks / os.sysconf("SC_CLK_TCK")


def server_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| server | clients | requests | served by | opened at (s) "
        "| dead-primary calls before the first probe | half-open moments "
        "| probes per moment | dead-primary calls per moment | server CPU s | load avg |",
        "|---|---:|---:|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        served = ", ".join(f"{k} {v}" for k, v in sorted(r["served"].items()))
        steps = r["steps"]
        probes = " / ".join(str(s["probes"]) for s in steps) or "—"
        calls = " / ".join(str(s["hits"]) for s in steps) or "—"
        opened = "—" if r["opened_at"] is None else f"{r['opened_at']:.1f}"
        out.append(
            f"| {r['label']} | {r['clients']} | {r['requests']} | {served} | {opened} "
            f"| {r['before_probe']} | {len(steps)} | {probes} | {calls} "
            f"| {r['cpu']:.1f} | {r['load']:.2f} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    main()
