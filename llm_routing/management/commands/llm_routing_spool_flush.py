"""``manage.py llm_routing_spool_flush``: write spooled routing decisions."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...conf import routing_settings
from ...recorder import flush_spool

__all__ = ["Command"]


class Command(BaseCommand):
    help = (
        'Write the routing decisions spooled in LLM_ROUTING["SPOOL_DIR"] while the '
        "database could not take them (idempotent: decisions already recorded are skipped)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        if not routing_settings.SPOOL_DIR:
            raise CommandError('LLM_ROUTING["SPOOL_DIR"] is not set: nothing is spooled.')
        report = flush_spool()
        self.stdout.write(
            f"Wrote {report.written} spooled decision(s); {report.already_recorded} were "
            f"already recorded; {report.rejected} rejected; {report.left} left for later."
        )
        if report.left:
            raise CommandError(
                f"The database failed during the flush; {report.left} decision(s) stay "
                "spooled. Run the command again once it is back."
            )
