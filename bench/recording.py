#!/usr/bin/env python3
"""What recording a decision costs the caller: inline vs write-behind, on PostgreSQL.

    .venv/bin/python bench/recording.py [--n 2000] [--database-url postgres://…/llmr_bench]

The database is created when missing and migrated. N real routing results (the mock
provider, one attempt each, not recorded) are built first; then, per mode:

* ``inline``       — ``recorder.record_or_spool`` with ``RECORD_MODE = "inline"``: the
                     decision and its attempts written before the call returns;
* ``write_behind`` — ``recorder.submit`` for all N, then one ``recorder.flush()``.

Printed per mode: the caller's time per decision (p50, p99), the wall time until all N
rows exist, the Python process CPU per decision (every thread) and the SQL statements
per decision (``execute_wrapper``; BEGIN/COMMIT are not statements of their own here,
so add two per transaction for round trips).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/llmr_writes_bench"
    )
    args = parser.parse_args()
    _ensure_database(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import override_settings

    from llm_routing import recorder
    from llm_routing.models import RoutingDecision
    from llm_routing.router import route
    from llm_routing.types import AuditRequest

    call_command("migrate", verbosity=0)
    RoutingDecision.objects.all().delete()
    request = AuditRequest(task="bench", input_text="x" * 200, provider="mock")
    results = [(request, route(request, persist=False)) for _ in range(2 * args.n)]
    print(f"PostgreSQL {connection.pg_version}, N = {args.n} decisions per mode\n")
    print(
        "| mode | caller µs p50 | caller µs p99 | wall ms for N | CPU µs/decision "
        "| statements/decision |"
    )
    print("|---|---:|---:|---:|---:|---:|")

    statements = 0

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    def measure(mode: str, batch: list[Any]) -> None:
        nonlocal statements
        statements = 0
        settings = {"DEFAULT_CHAIN": [], "RECORD_MODE": mode}
        caller: list[float] = []
        before = recorder.write_behind_stats().batches
        with override_settings(LLM_ROUTING=settings):
            wall, cpu = time.perf_counter(), time.process_time()
            with connection.execute_wrapper(count):
                for pair in batch:
                    start = time.perf_counter()
                    if mode == "inline":
                        recorder.record_or_spool(*pair)
                    else:
                        recorder.submit(*pair)
                    caller.append((time.perf_counter() - start) * 1e6)
            if mode == "write_behind":
                assert recorder.flush(timeout=120)
                # The writer's two INSERTs per batch run on its own connection.
                statements_writer = 2 * (recorder.write_behind_stats().batches - before)
            else:
                statements_writer = statements
            wall = (time.perf_counter() - wall) * 1000
            cpu = (time.process_time() - cpu) * 1e6 / len(batch)
        missing = recorder.missing_decisions([r.request_id for _, r in batch])
        assert not missing, f"{len(missing)} decisions missing"
        p50 = statistics.median(caller)
        p99 = statistics.quantiles(caller, n=100)[98]
        per = statements_writer / len(batch)
        print(f"| {mode} | {p50:.0f} | {p99:.0f} | {wall:.0f} | {cpu:.0f} | {per:.3f} |")

    measure("inline", results[: args.n])
    measure("write_behind", results[args.n :])
    RoutingDecision.objects.all().delete()


if __name__ == "__main__":
    main()
