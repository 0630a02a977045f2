"""Benchmark: what budgets add to a request — ``budgets.check`` (+ ``settle``).

    .venv/bin/python bench/budgets_check.py [--redis-url redis://127.0.0.1:6379/10] \\
        [--calls 2000] [--rounds 9]

Variants, each timed per call (median and p95 of the per-round medians):

- ``no budget``: no Budget row at all (the cached empty row list: no query, no cache);
- ``3 budgets, LocMem``: a user, a group and a token budget under the process lock;
- ``3 budgets, Redis``: the same through the Lua script (one round trip), plus the
  settle of the answer's tokens (a second round trip) in ``+ settle``; without it, the
  request's end releases its place in flight in the tokens-capped budget (the second
  round trip of a request that never settles, e.g. an async job's submission).

The database is a throwaway SQLite file; the budgets are never exhausted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import interleaved_samples  # noqa: E402


def setup(db_path: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{db_path}"
    os.environ["LLM_ROUTING_LOG_LEVEL"] = "ERROR"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/10")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="llmr-bench-budgets-")
    setup(os.path.join(tmp, "db.sqlite3"))

    from django.contrib.auth.models import Group, User
    from django.test import override_settings
    from rest_framework.authtoken.models import Token

    from llm_routing import budgets
    from llm_routing.access import principal_for
    from llm_routing.models import Budget

    user = User.objects.create_user("bench", password="pw-bench-123")
    user.groups.add(Group.objects.create(name="bench-group"))
    token = Token.objects.create(user=user).key
    principal = principal_for(user)
    big = 10**12
    prefix = f"llmr-bench-budgets-{uuid.uuid4().hex[:8]}"
    redis_cache = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": args.redis_url,
            "KEY_PREFIX": prefix,
        }
    }
    locmem = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

    def timed(caches: dict[str, object], with_budgets: bool, settle: bool) -> Callable[[], float]:
        def run() -> float:
            with override_settings(CACHES=caches):
                if with_budgets and not Budget.objects.exists():
                    Budget.objects.create(name="u", scope="user", subject="bench", max_requests=big)
                    Budget.objects.create(
                        name="g", scope="group", subject="bench-group", max_tokens=big
                    )
                    Budget.objects.create(name="t", scope="token", subject=token, max_requests=big)
                elif not with_budgets:
                    Budget.objects.all().delete()
                budgets.applicable(principal, token)  # rows cached outside the timing
                start = time.perf_counter()
                for _ in range(args.calls):
                    budgets.check(principal, token)
                    if settle:
                        budgets.settle(7)
                    budgets.forget()  # the request's end (after a settle: nothing to do)
                return (time.perf_counter() - start) / args.calls * 1e6

        return run

    variants = {
        "no budget": timed(locmem, False, False),
        "3 budgets, LocMem": timed(locmem, True, False),
        "3 budgets, Redis (check + release)": timed(redis_cache, True, False),
        "3 budgets, Redis (check + settle)": timed(redis_cache, True, True),
    }
    samples = interleaved_samples(variants, rounds=args.rounds, warmup=1)
    print(f"per request, {args.calls} calls x {args.rounds} rounds (µs)")
    print("| variant | median µs | p95 µs |")
    print("|---|---|---|")
    for name, values in samples.items():
        p95 = sorted(values)[int(0.95 * (len(values) - 1))]
        print(f"| {name} | {statistics.median(values):.1f} | {p95:.1f} |")
    import redis

    client = redis.Redis.from_url(args.redis_url)
    for key in client.scan_iter(match=f"{prefix}:*", count=500):
        client.delete(key)


if __name__ == "__main__":
    main()
