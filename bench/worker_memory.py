"""Memory per web worker: the shipped gunicorn.conf.py (uvicorn workers, production
settings: PostgreSQL, Redis, ``LLM_ROUTING_RECORD_MODE=write_behind``) started the way
``bench/gateways.py`` starts "this app (ASGI)", loaded against a fake OpenAI-format
upstream; each worker's RSS, PSS and USS read from ``/proc`` at every stage.

    .venv/bin/python bench/worker_memory.py \
        --database-url postgres://postgres@127.0.0.1:5432/llm_routing_memory \
        --redis-url redis://127.0.0.1:6379/0

Stages: idle after start; after a warm-up; after ``--requests`` non-stream requests at
16 clients (0 ms upstream); right after ``--slow-clients`` clients for ``--seconds`` s
against a 1 s upstream (what bench/gateways.py ends with before it reads RSS); and
``--settle`` s later, when the requests still in flight have been answered.

* RSS = ``VmRSS`` (``/proc/<pid>/status``): every page the worker maps and touched,
  shared ones included — what issue 14's target "RSS ≤ 150 MiB per worker" counts;
* PSS = ``Pss`` (``/proc/<pid>/smaps_rollup``): shared pages divided among the
  processes that share them; the sum over master + workers is the box's real cost;
* USS = ``Private_Clean + Private_Dirty``: what the worker alone holds (freed if it dies).

``--app`` picks what the workers serve: ``lane`` (the default, as shipped:
``project.asgi:application``, ``/v1`` on the lean lane) or ``django``
(``project.asgi:django_application``, ``/v1`` through Django's request cycle, as
bench/gateways.py's "Django path").

Unless ``--no-modules``, the gunicorn config is the shipped file plus a
``post_worker_init`` hook (in a temporary wrapper, nothing else changed) that makes a
worker report on SIGUSR2 — its threads by name, gc-tracked objects by type, Python memory
blocks, glibc's malloc counters and ``sys.modules`` — sent after the warm-up, right after
the slow load and at the end; the script prints the object types that grew under load,
each worker's RSS by kind of mapping (``/proc/<pid>/smaps``), and what each package's
imports allocate: a fresh interpreter imports the worker's modules with
:mod:`tracemalloc` on, each import measured by what it allocates itself (its own module
body, not the modules it imports), grouped by top-level package.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateways import (  # type: ignore[import-not-found]
    BODY,
    ROOT,
    app_env,
    free_port,
    prepare_app,
    started,
    warm_up,
    wrk,
)

SHIPPED = ROOT / "gunicorn.conf.py"
#: ``--app``: the shipped application (``/v1`` on the lean lane) or Django's alone.
APPS = {"lane": "project.asgi:application", "django": "project.asgi:django_application"}

WRAPPER = '''\
# The shipped gunicorn.conf.py, unchanged, plus a post_worker_init hook that makes the
# worker write a report on SIGUSR2 (bench/worker_memory.py). Nothing else differs.
exec(compile(open({shipped!r}).read(), {shipped!r}, "exec"))


def malloc_info():
    """glibc's malloc counters (mallinfo2): in use vs held free, MiB."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = Info
    except (OSError, AttributeError):
        return {{}}
    i = libc.mallinfo2()
    return {{"heap_in_use": i.uordblks / 2**20, "heap_free": i.fordblks / 2**20,
            "mmapped": i.hblkhd / 2**20}}


def post_worker_init(worker):
    import json as _json
    import os as _os
    import signal as _signal
    import sys as _sys

    def _dump(signum, frame):
        report = {{"modules": list(_sys.modules), "malloc": malloc_info()}}
        report["blocks"] = _sys.getallocatedblocks()
        import gc as _gc
        _objects = _gc.get_objects()
        report["objects"] = len(_objects)
        _types = {{}}
        for _o in _objects:
            _t = type(_o)
            _k = str(_t.__dict__.get("__module__", "")) + "." + _t.__name__
            _types[_k] = _types.get(_k, 0) + 1
        report["types"] = _types
        del _objects
        import threading as _th
        report["threads"] = _th.active_count()
        names = {{}}
        for t in _th.enumerate():
            key = t.name.rstrip("0123456789_-")
            names[key] = names.get(key, 0) + 1
        report["thread_names"] = names
        _path = {out!r} + "." + str(_os.getpid())
        with open(_path + ".tmp", "w") as _f:
            _json.dump(report, _f)
        _os.replace(_path + ".tmp", _path)  # the bench never reads half a report

    _signal.signal(_signal.SIGUSR2, _dump)
'''


def booted(log: Path, workers: int, timeout: float = 120.0) -> None:
    """Wait until every worker said "Application startup complete" (imports done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.read_text(errors="replace").count("Application startup complete") >= workers:
            time.sleep(0.5)
            return
        time.sleep(0.2)
    raise RuntimeError(f"the workers did not boot in {timeout:.0f} s (see {log})")


def children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return sorted(int(p) for p in text.split())
    return []


def memory_kib(pid: int) -> dict[str, int]:
    """RSS, PSS and USS of one process, KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()

    def field(text: str, name: str) -> int:
        m = re.search(rf"^{name}:\s+(\d+) kB", text, re.M)
        return int(m.group(1)) if m else 0

    return {
        "rss": field(status, "VmRSS"),
        "pss": field(rollup, "Pss"),
        "uss": field(rollup, "Private_Clean") + field(rollup, "Private_Dirty"),
        "anon": field(rollup, "Anonymous"),
    }


def rss_by_kind(pid: int) -> dict[str, float]:
    """A process's RSS by the kind of mapping holding it, MiB (``/proc/<pid>/smaps``):
    the malloc heap, glibc's per-thread malloc arenas (64 MiB reservations), thread
    stacks (8 MiB), pymalloc's 1 MiB arenas, other anonymous memory, mapped files."""
    out: dict[str, int] = {}
    kind = "other"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$", line)
        if m:
            size = (int(m.group(2), 16) - int(m.group(1), 16)) // 1024
            name = m.group(3).strip()
            if name == "[heap]":
                kind = "malloc heap"
            elif name.startswith("/"):
                kind = "mapped files (code, shared libraries)"
            elif name:
                kind = name
            elif 8000 <= size <= 8192:
                kind = "thread stacks (8 MiB each)"
            elif 60_000 < size <= 65_536:
                kind = "malloc arenas of other threads (64 MiB each)"
            elif size == 1024:
                kind = "pymalloc arenas (1 MiB)"
            else:
                kind = "other anonymous"
        elif line.startswith("Rss:"):
            out[kind] = out.get(kind, 0) + int(line.split()[1])
    return {k: v / 1024 for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v >= 512}


def snapshot(master: int) -> dict[str, dict[str, int]]:
    out = {"master": memory_kib(master)}
    for i, pid in enumerate(children(master)):
        with contextlib.suppress(OSError):
            out[f"worker {i + 1} ({pid})"] = memory_kib(pid)
    return out


def mib(kib: int) -> str:
    return f"{kib / 1024:.0f}"


def print_stage(name: str, snap: dict[str, dict[str, int]]) -> None:
    print(f"\n### {name}\n")
    print("| process | RSS MiB | PSS MiB | USS MiB | anonymous MiB |")
    print("|---|---:|---:|---:|---:|")
    for proc, m in snap.items():
        print(
            f"| {proc} | {mib(m['rss'])} | {mib(m['pss'])} | {mib(m['uss'])} | {mib(m['anon'])} |"
        )
    total = sum(m["pss"] for m in snap.values())
    print(f"| **sum of PSS** (the box's cost) | | {mib(total)} | | |", flush=True)


# --- the per-module import cost, in a fresh interpreter ----------------------------------

PROFILE = r"""
import importlib, importlib._bootstrap as boot, json, sys, tracemalloc
names = json.load(open(sys.argv[1]))
tracemalloc.start()
own = {}
stack = [0]
real = boot._find_and_load

def find_and_load(name, import_):
    stack.append(0)
    before = tracemalloc.get_traced_memory()[0]
    try:
        return real(name, import_)
    finally:
        total = tracemalloc.get_traced_memory()[0] - before
        nested = stack.pop()
        own[name] = own.get(name, 0) + total - nested
        stack[-1] += total

boot._find_and_load = find_and_load
import django
django.setup()
for name in names:
    try:
        importlib.import_module(name)
    except Exception:
        pass
boot._find_and_load = real
json.dump({"own": own, "total": tracemalloc.get_traced_memory()[0]}, sys.stdout)
"""


def module_report(names: list[str], env: dict[str, str], top: int) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(names, f)
    out = subprocess.run(
        [sys.executable, "-c", PROFILE, f.name],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(f.name)
    data = json.loads(out)
    by_package: dict[str, list[int]] = {}
    for name, size in data["own"].items():
        entry = by_package.setdefault(name.split(".")[0], [0, 0])
        entry[0] += size
        entry[1] += 1
    print(
        f"\n### The worker's imports: {len(names)} modules; "
        f"{data['total'] / 2**20:.1f} MiB traced after importing them\n"
    )
    print("| top-level package | modules | allocated by its imports (MiB) |")
    print("|---|---:|---:|")
    ranked = sorted(by_package.items(), key=lambda kv: -kv[1][0])
    for package, (size, count) in ranked[:top]:
        print(f"| {package} | {count} | {size / 2**20:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=400, help="at 16 clients, 0 ms upstream")
    parser.add_argument("--slow-clients", type=int, default=1000, help="0: skip that stage")
    parser.add_argument("--seconds", type=int, default=8, help="length of the slow stage")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the load")
    parser.add_argument("--top", type=int, default=15, help="packages listed")
    parser.add_argument("--no-modules", dest="modules", action="store_false")
    parser.add_argument(
        "--app",
        choices=sorted(APPS),
        default="lane",
        help="what the workers serve (default: lane, the shipped project/asgi.py)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the server (e.g. MALLOC_ARENA_MAX=2)",
    )
    args = parser.parse_args()
    args.workers = max(1, args.workers)
    fast_port, slow_port, port = free_port(), free_port(), free_port()
    up = [sys.executable, str(ROOT / "bench" / "gateways.py"), "--serve-upstream"]
    workdir = Path(tempfile.mkdtemp(prefix="worker-memory-"))
    modules_out = str(workdir / "modules")
    config = workdir / "gunicorn.conf.py"
    config.write_text(WRAPPER.format(shipped=str(SHIPPED), out=modules_out))
    with (
        started([*up, str(fast_port), "0"], port=fast_port),
        started([*up, str(slow_port), "1"], port=slow_port),
    ):
        token = prepare_app(args, fast_port, slow_port)
        env = app_env(args, port)
        env["GUNICORN_APP"] = APPS[args.app]
        env.update(dict(item.split("=", 1) for item in args.env))
        cmd = [sys.executable, "-m", "gunicorn", "-c", str(config if args.modules else SHIPPED)]
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {token}"}
        print(
            f"serving {APPS[args.app]} ({args.app}); extra environment: "
            f"{args.env or 'none'}; {args.workers} workers"
        )
        with started(cmd, port=port, env=env, log=workdir / "server.log") as proc:
            booted(workdir / "server.log", args.workers)
            print_stage("idle, after start", snapshot(proc.pid))
            warm_up(url, headers, BODY, count=8 * args.workers)
            print_stage("after a warm-up", snapshot(proc.pid))
            warm: list[dict[str, Any]] = []
            loaded: list[dict[str, Any]] = []
            if args.modules:
                warm = dump_workers(proc.pid, modules_out)
                print_states("after a warm-up", warm)
            run = requests_at(url, headers, args.requests, clients=16)
            print_stage(f"after {run} requests at 16 clients (0 ms upstream)", snapshot(proc.pid))
            if args.slow_clients:
                slow = wrk(
                    url,
                    headers,
                    {**BODY, "model": "slow"},
                    connections=args.slow_clients,
                    seconds=args.seconds,
                )
                print_stage(
                    f"after {args.slow_clients} clients x {args.seconds} s, 1 s upstream "
                    f"({slow.requests} answers, {slow.errors} errors)",
                    snapshot(proc.pid),
                )
                print_kinds(proc.pid)
                if args.modules:
                    loaded = dump_workers(proc.pid, modules_out)
                    print_states("right after the load", loaded)
            time.sleep(args.settle)
            print_stage(f"{args.settle:.0f} s later (in-flight requests done)", snapshot(proc.pid))
            print_kinds(proc.pid)
            dumps = dump_workers(proc.pid, modules_out) if args.modules else []
        print_states(f"{args.settle:.0f} s after the load", dumps)
        if warm and loaded:
            grown = {
                k: n - max(w["types"].get(k, 0) for w in warm)
                for k, n in loaded[0]["types"].items()
            }
            print("\nObjects more numerous right after the load than after the warm-up (worker 1):")
            for k, n in sorted(grown.items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"  {k}: +{n:,}")
        if dumps:
            names = dumps[0]["modules"]
            module_report(names, app_env(args, 0), args.top)


def print_kinds(master: int) -> None:
    pids = children(master)
    kinds = [rss_by_kind(pid) for pid in pids]
    threads = [len(os.listdir(f"/proc/{pid}/task")) for pid in pids]
    print(
        "\n| RSS by mapping (MiB) | "
        + " | ".join(f"worker {i + 1}" for i in range(len(pids)))
        + " |"
    )
    print("|---|" + "---:|" * len(kinds))
    for kind in dict.fromkeys(k for each in kinds for k in each):
        print(f"| {kind} | " + " | ".join(f"{each.get(kind, 0):.1f}" for each in kinds) + " |")
    print("| threads (count) | " + " | ".join(str(n) for n in threads) + " |", flush=True)


def print_states(stage: str, dumps: list[dict[str, Any]]) -> None:
    for i, dump in enumerate(dumps):
        heap = dump["malloc"]
        print(
            f"\nworker {i + 1}, {stage}: {dump['threads']} threads {dump['thread_names']}, "
            f"{dump['objects']:,} gc-tracked objects, "
            f"{dump['blocks']:,} Python memory blocks in use; malloc: "
            + ", ".join(f"{k} {v:.1f} MiB" for k, v in heap.items())
        )


def dump_workers(master: int, out: str) -> list[dict[str, Any]]:
    """SIGUSR2 to each worker (the wrapper's hook); their reports."""
    pids = children(master)
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)
    reports: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    for pid in pids:
        path = Path(f"{out}.{pid}")
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                reports.append(json.loads(path.read_text()))
                path.unlink()
                break
            time.sleep(0.2)
    return reports


def requests_at(url: str, headers: dict[str, str], count: int, *, clients: int) -> int:
    """``count`` POSTs from ``clients`` concurrent httpx clients; the number answered 200."""
    import asyncio

    import httpx

    async def go() -> int:
        done = 0
        queue = iter(range(count))

        async def client() -> None:
            nonlocal done
            async with httpx.AsyncClient(timeout=30) as c:
                for _ in queue:
                    r = await c.post(url, json=BODY, headers=headers)
                    done += r.status_code == 200

        await asyncio.gather(*(client() for _ in range(clients)))
        return done

    return asyncio.run(go())


if __name__ == "__main__":
    main()
