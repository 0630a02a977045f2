"""``manage.py llm_routing_audit --task T --input TEXT [--json]`` — one routed request."""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_routing import audit, pricing

__all__ = ["Command"]


class Command(BaseCommand):
    help = (
        "Route one request through the configured chain (recorded like an HTTP request) "
        "and print the result and its routing metadata."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--task", required=True)
        parser.add_argument(
            "--input", required=True, help="The input text; '-' reads standard input."
        )
        parser.add_argument("--instructions", default="")
        parser.add_argument("--provider", help="Try this provider first (router mode explicit).")
        parser.add_argument("--force-provider", help="Use exactly this provider (mode forced).")
        parser.add_argument("--route", help="Route key matched against routing rules.")
        parser.add_argument(
            "--metadata",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="Request metadata; may be repeated.",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print the HTTP envelope of POST /audit/."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        metadata: dict[str, str] = {}
        for item in options["metadata"]:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise CommandError(f"--metadata expects KEY=VALUE, got {item!r}.")
            metadata[key] = value
        text = sys.stdin.read() if options["input"] == "-" else options["input"]
        kwargs: dict[str, Any] = {
            "task": options["task"],
            "input_text": text,
            "instructions": options["instructions"],
            "metadata": metadata,
        }
        for name in ("provider", "force_provider", "route"):
            if options[name]:
                kwargs[name] = options[name]
        try:
            routed = audit(**kwargs)
        except ValidationError as exc:
            problems = "; ".join(
                f"{field}: {' '.join(messages)}" for field, messages in exc.message_dict.items()
            )
            raise CommandError(f"Invalid request — {problems}") from None
        if options["json"]:
            self.stdout.write(json.dumps(pricing.envelope(routed), indent=2, sort_keys=True))
            return
        result, meta = routed.result, routed.metadata
        self.stdout.write(f"request_id:  {routed.request_id}")
        self.stdout.write(
            f"result:      {result.status} from {result.provider} "
            f"(model {result.model or '-'}, mode {result.mode}, {result.latency_ms:.1f} ms)"
        )
        if result.error is not None:
            self.stdout.write(f"error:       {result.error.category}: {result.error.message}")
        if result.output:
            self.stdout.write(f"output:      {result.output}")
        if result.data is not None:
            self.stdout.write(f"data:        {json.dumps(result.data, sort_keys=True)}")
        self.stdout.write(
            f"routing:     mode {meta.router_mode}, chain {meta.chain_name or '-'} "
            f"[{', '.join(meta.chain)}], rule {meta.rule or '-'}"
        )
        for attempt in meta.attempts:
            if attempt.outcome == "skipped":
                line = f"skipped ({attempt.reason})"
            else:
                line = f"{attempt.outcome}"
                if attempt.error_category:
                    line += f" ({attempt.error_category}, HTTP {attempt.http_status or '-'})"
                line += f", {attempt.retries} retries, {attempt.latency_ms:.1f} ms"
            self.stdout.write(f"  #{attempt.index} {attempt.provider}: {line}")
        fallback = f"yes ({meta.fallback_reason})" if meta.fallback_used else "no"
        self.stdout.write(f"fallback:    {fallback}")
