"""``manage.py llm_routing_purge [--days N] [--batch-size N] [--dry-run]``."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...retention import purge

__all__ = ["Command"]


class Command(BaseCommand):
    help = (
        "Delete routing decisions (with their attempts) and async audit jobs older than "
        'LLM_ROUTING["RETENTION_DAYS"], in batches of RETENTION_BATCH_SIZE.'
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--days", type=float, default=None, help="Override RETENTION_DAYS for this run."
        )
        parser.add_argument(
            "--batch-size", type=int, default=None, help="Override RETENTION_BATCH_SIZE."
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Only count the rows that would go."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = purge(
                days=options["days"],
                batch_size=options["batch_size"],
                dry_run=options["dry_run"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        verb = "Would delete" if report.dry_run else "Deleted"
        self.stdout.write(
            f"{verb} {report.decisions} decision(s), {report.attempts} attempt(s) and "
            f"{report.jobs} job(s) created before {report.cutoff.isoformat()}."
        )
