"""``manage.py llm_routing_check_decisions --ids-file F``: answered request ids without a
decision row (the benchmark's invariant: every answered request is recorded)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...recorder import missing_decisions

__all__ = ["Command"]


class Command(BaseCommand):
    help = (
        "Print the request ids (one per line in --ids-file, '-' for stdin) that have no "
        "routing decision row; exits non-zero when any is missing. With write-behind "
        "recording, run it after the server has flushed (stopped, or recorder.flush())."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--ids-file", required=True, help="one request id per line")

    def handle(self, *args: Any, **options: Any) -> None:
        source = options["ids_file"]
        try:
            text = sys.stdin.read() if source == "-" else Path(source).read_text()
        except OSError as exc:
            raise CommandError(f"Cannot read --ids-file: {exc.strerror}") from exc
        ids = [line.strip() for line in text.splitlines() if line.strip()]
        missing = missing_decisions(ids)
        for request_id in sorted(missing):
            self.stdout.write(request_id)
        if missing:
            raise CommandError(f"{len(missing)} of {len(ids)} request id(s) have no decision row.")
        self.stdout.write(f"All {len(ids)} request id(s) have a decision row.")
