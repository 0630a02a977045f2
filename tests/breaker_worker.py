"""A separate worker process that runs the router against a shared cache.

Used by tests/test_breaker_services.py (and bench/) as "another gunicorn worker"::

    python -m tests.breaker_worker '<json config>'

Config keys: ``db`` (SQLite file of this worker), ``caches`` (the CACHES setting),
``routing`` (LLM_ROUTING), ``providers`` (rows: name, model, base_url, max_retries,
timeout_s — chained in this order before the mock), ``requests`` and ``threads``.
Every finished request prints one JSON line on stdout: the served provider, the skipped
and the attempted providers.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any


def main(argv: list[str]) -> int:
    config: dict[str, Any] = json.loads(argv[1])
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{config['db']}"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections
    from django.test.utils import override_settings

    override_settings(CACHES=config["caches"], LLM_ROUTING=config["routing"]).enable()
    call_command("migrate", verbosity=0)

    from llm_routing.models import Chain, ChainEntry, Provider
    from llm_routing.router import route
    from llm_routing.types import AuditRequest

    from .breaker_support import KIND, install

    install()
    chain = Chain.objects.create(name="workers", is_default=True)
    for position, spec in enumerate(config["providers"]):
        row = Provider.objects.create(kind=KIND, **spec)
        ChainEntry.objects.create(chain=chain, provider=row, position=position)
    connections.close_all()

    threads = int(config.get("threads", 1))
    per_thread = int(config["requests"]) // threads
    barrier = threading.Barrier(threads)
    out = threading.Lock()

    def worker() -> None:
        barrier.wait()
        try:
            for _ in range(per_thread):
                routed = route(
                    AuditRequest(task="worker", input_text="x"),
                    sleeper=lambda s: None,
                    persist=False,
                )
                meta = routed.metadata.to_dict()
                line = json.dumps(
                    {
                        "provider": routed.result.provider,
                        "status": routed.result.status,
                        "skipped": meta["skipped_providers"],
                        "attempted": meta["attempted_providers"],
                    }
                )
                with out:
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()
        finally:
            connections.close_all()

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
