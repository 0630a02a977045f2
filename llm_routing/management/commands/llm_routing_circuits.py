"""Print the circuit state and passive health of every provider; reset circuits.

manage.py llm_routing_circuits                 # a table
manage.py llm_routing_circuits --json          # the same as JSON (GET /health/ shape)
manage.py llm_routing_circuits --reset NAME    # close NAME's circuits (repeatable)
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...models import Provider
from ...resilience import breaker

__all__ = ["Command"]

COLUMNS = ("provider", "model", "state", "failures", "open_until", "last_success", "last_error")


class Command(BaseCommand):
    help = "Print circuit breaker states per (provider, model); --reset NAME closes them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--reset",
            action="append",
            default=[],
            metavar="NAME",
            help="Reset every circuit of the provider NAME (may be given more than once).",
        )
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")

    def handle(self, *args: Any, **options: Any) -> None:
        for name in options["reset"]:
            row = Provider.objects.filter(name=name).first()
            if row is None:
                raise CommandError(f"No provider is named {name!r}.")
            count = breaker.store.reset_provider(row)
            self.stdout.write(f"Reset {count} circuit(s) of {name}.")
        rows = list(Provider.objects.order_by("name"))
        circuits = breaker.store.for_providers(rows)
        now = breaker.store.clock()
        entries = [
            {"provider": c.provider, "model": c.model, **c.health(now)}
            for p in rows
            for c in circuits[p.name]
        ]
        if options["json"]:
            self.stdout.write(json.dumps({"circuits": entries}, indent=2))
            return
        if not entries:
            self.stdout.write("No providers.")
            return
        table = [COLUMNS] + [_row(e) for e in entries]
        widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
        for line in table:
            self.stdout.write(
                "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
            )
        if breaker.store.degraded:
            self.stderr.write("The circuit cache is unreachable: showing process-local state.")


def _row(entry: dict[str, Any]) -> tuple[str, ...]:
    error = entry["last_error_category"] or "-"
    if entry["last_http_status"]:
        error = f"{error} {entry['last_http_status']}"
    if entry["last_error_at"]:
        error = f"{error} at {entry['last_error_at']}"
    return (
        entry["provider"],
        entry["model"] or "-",
        entry["state"],
        str(entry["consecutive_failures"]),
        entry["open_until"] or "-",
        entry["last_success_at"] or "-",
        error,
    )
