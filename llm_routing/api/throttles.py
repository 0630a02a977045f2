"""DRF throttles whose rates come from ``LLM_ROUTING["API_THROTTLE_RATES"]``."""

from __future__ import annotations

from rest_framework.throttling import AnonRateThrottle, UserRateThrottle

from ..conf import routing_settings

__all__ = ["AuditAnonThrottle", "AuditUserThrottle"]


class AuditUserThrottle(UserRateThrottle):
    scope = "llm_routing_user"

    def get_rate(self) -> str | None:
        rate = (routing_settings.API_THROTTLE_RATES or {}).get("user")
        return str(rate) if rate else None


class AuditAnonThrottle(AnonRateThrottle):
    scope = "llm_routing_anon"

    def get_rate(self) -> str | None:
        rate = (routing_settings.API_THROTTLE_RATES or {}).get("anon")
        return str(rate) if rate else None
