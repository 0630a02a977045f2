"""``manage.py llm_routing_export [-o routing.toml]`` — canonical TOML of the database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_routing.config_io import ConfigError, export

__all__ = ["Command"]


class Command(BaseCommand):
    help = "Write the providers, chains and rules in the database as llm_routing_apply's TOML."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("-o", "--output", help="Write to this file instead of standard output.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            text = export()
        except ConfigError as exc:
            raise CommandError("\n".join(exc.errors)) from None
        if options["output"]:
            try:
                Path(options["output"]).write_text(text, encoding="utf-8")
            except OSError as exc:
                raise CommandError(f"Cannot write {options['output']}: {exc}") from None
        else:
            self.stdout.write(text, ending="")
