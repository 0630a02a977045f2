from __future__ import annotations

from django.apps import AppConfig


class LlmRoutingConfig(AppConfig):
    name = "llm_routing"
    verbose_name = "LLM routing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Wire checks, the settings-reload receiver and the key-redacting log filter;
        # nothing else happens at start-up.

        from . import checks, conf, observability  # noqa: F401
        from .logging import install

        install()
        observability.connect()
