from __future__ import annotations

from django.apps import AppConfig


class LlmRoutingConfig(AppConfig):
    name = "llm_routing"
    verbose_name = "LLM routing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Wire checks, the settings-reload receiver and the key-redacting log filter;
        # nothing else happens at start-up.
        from django.db.models.signals import post_delete, post_save

        from . import checks, conf, observability  # noqa: F401
        from .logging import install
        from .models import Provider
        from .pricing import forget

        install()
        post_save.connect(forget, sender=Provider, dispatch_uid="llm_routing.pricing.forget")
        post_delete.connect(forget, sender=Provider, dispatch_uid="llm_routing.pricing.forget_del")
        observability.connect()
