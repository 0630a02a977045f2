"""``Authorization: Bearer <token>`` with DRF's tokens (what OpenAI clients send)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import TokenAuthentication

__all__ = ["BearerTokenAuthentication"]


class BearerTokenAuthentication(TokenAuthentication):
    keyword = "Bearer"


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "llm_routing.api.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "The same DRF token."}
