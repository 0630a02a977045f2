"""Seed the demo: mock, an OpenAI provider without its key, a disabled Anthropic
provider, a default chain over them and one rule. When DEBUG is on, also a demo admin
user and an API token, printed with a ready-to-paste curl line."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from rest_framework.authtoken.models import Token

from llm_routing.models import Chain, ChainEntry, Provider, RoutingRule

DEMO_USER = "demo"
DEMO_PASSWORD = "demo-password-change-me"  # noqa: S105 - printed for the local demo only
DEMO_OPENAI_KEY_ENV = "DEMO_OPENAI_API_KEY"


class Command(BaseCommand):
    help = "Create the demo providers, chain and rule (idempotent)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=8000, help="Port for the printed curl.")

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        mock, _ = Provider.objects.update_or_create(
            name="mock", defaults={"kind": "mock", "model": "mock-1", "enabled": True}
        )
        openai, _ = Provider.objects.update_or_create(
            name="openai-main",
            defaults={
                "kind": "openai",
                "model": "gpt-4o-mini",
                "api_key_env": DEMO_OPENAI_KEY_ENV,
                "enabled": True,
                "supports_structured_output": True,
                "supports_streaming": True,
            },
        )
        anthropic, _ = Provider.objects.update_or_create(
            name="anthropic",
            defaults={
                "kind": "anthropic",
                "model": "claude-sonnet-4-5",
                "api_key_env": "ANTHROPIC_API_KEY",
                "enabled": False,
                "supports_structured_output": True,
                "supports_streaming": True,
                "supports_prefill": True,
            },
        )
        chain, _ = Chain.objects.update_or_create(
            name="default",
            defaults={"description": "Demo chain: OpenAI, then Anthropic.", "is_default": True},
        )
        chain.entries.all().delete()
        ChainEntry.objects.create(chain=chain, provider=openai, position=0)
        ChainEntry.objects.create(chain=chain, provider=anthropic, position=1)
        cheap, _ = Chain.objects.update_or_create(
            name="cheap", defaults={"description": "Offline answers only.", "is_default": False}
        )
        cheap.entries.all().delete()
        ChainEntry.objects.create(chain=cheap, provider=mock, position=0)
        RoutingRule.objects.update_or_create(
            name="cheap-route",
            defaults={"priority": 10, "enabled": True, "route": "cheap", "chain": cheap},
        )
        self.stdout.write(
            self.style.SUCCESS(
                "Seeded providers mock, openai-main (key variable "
                f"{DEMO_OPENAI_KEY_ENV} unset → missing_key), anthropic (disabled); "
                "chains default, cheap; rule cheap-route."
            )
        )
        if not settings.DEBUG:
            return
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(
            username=DEMO_USER, defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        token, _ = Token.objects.get_or_create(user=user)
        port = options["port"]
        self.stdout.write(
            f"\nDemo admin: http://127.0.0.1:{port}/admin/  user {DEMO_USER!r}, "
            f"password {DEMO_PASSWORD!r} (DEBUG only)\n"
            f"API token: {token.key}\n\n"
            f"curl -s -X POST http://127.0.0.1:{port}/audit/ \\\n"
            f"  -H 'Authorization: Token {token.key}' -H 'Content-Type: application/json' \\\n"
            '  -d \'{"task": "summarize", "input_text": "Django is a web framework."}\'\n'
        )
