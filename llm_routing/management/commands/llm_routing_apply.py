"""``manage.py llm_routing_apply routing.toml [--dry-run] [--prune]``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_routing.config_io import ConfigError, apply

__all__ = ["Command"]


class Command(BaseCommand):
    help = (
        "Make the providers, chains, rules and budgets in the database match a TOML file. "
        "Validates the whole file first, then writes in one transaction; prints the changes."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="The TOML file ('-' reads standard input).")
        parser.add_argument(
            "--dry-run", action="store_true", help="Print the changes without making them."
        )
        parser.add_argument(
            "--prune",
            action="store_true",
            help="Also delete providers, chains, rules and budgets that the file does not declare.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["path"]
        try:
            if path == "-":
                text = sys.stdin.read()
            else:
                text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"Cannot read {path}: {exc}") from None
        try:
            changes = apply(text, prune=options["prune"], dry_run=options["dry_run"])
        except ConfigError as exc:
            lines = "\n".join(f"  {e}" for e in exc.errors)
            raise CommandError(f"{path}: nothing was changed.\n{lines}") from None
        for change in changes:
            style = {"+": self.style.SUCCESS, "-": self.style.ERROR}.get(
                change.action, self.style.WARNING
            )
            self.stdout.write(style(str(change)))
        verb = "would change" if options["dry_run"] else "changed"
        if changes:
            self.stdout.write(f"{len(changes)} row(s) {verb}.")
        else:
            self.stdout.write("No changes: the database already matches the file.")
