"""Include with ``path("", include("llm_routing.urls"))`` (or under any prefix)."""

from .api.urls import app_name, urlpatterns

__all__ = ["app_name", "urlpatterns"]
