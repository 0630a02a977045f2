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
        _link_from_the_admin_index()


def _link_from_the_admin_index() -> None:
    """The default admin site's index shows the routing dashboard, circuit board and
    explain links at its top — unless the host set its own ``index_template`` (then
    ``{% load llm_routing_admin %}{% llmr_admin_links %}`` puts them where it likes)."""
    from django.apps import apps

    if not apps.is_installed("django.contrib.admin"):
        return
    from django.contrib import admin

    if admin.site.index_template is None:
        admin.site.index_template = "admin/llm_routing/site_index.html"
