"""System checks. Messages, hints and ids live together in :data:`MESSAGES`.

====================  ==========================================================
id                    meaning
====================  ==========================================================
llm_routing.E001      unknown key in settings.LLM_ROUTING
llm_routing.E002      LLM_ROUTING is not a dict / a value has the wrong type
llm_routing.W010      httpx / httpcore debug logging is on (it logs request headers)
====================  ==========================================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import DEFAULTS, routing_settings

__all__ = ["MESSAGES", "check_http_debug_logging", "check_settings"]

MESSAGES: dict[str, tuple[str, str]] = {
    "E001": (
        "Unknown LLM_ROUTING setting(s): {keys}.",
        "Remove or rename them; valid keys are listed in docs/configuration.md.",
    ),
    "E002": (
        "LLM_ROUTING is malformed: {detail}.",
        "LLM_ROUTING must be a dict; see docs/configuration.md for each key's type.",
    ),
    "W010": (
        "Debug logging is enabled for {loggers}: request lines and headers of provider "
        "calls are logged.",
        "Set these loggers to INFO or higher in production; llm_routing redacts known key "
        "values from their records, but headers of other services are not covered.",
    ),
}


def _message(
    level: Callable[..., checks.CheckMessage], code: str, **params: Any
) -> checks.CheckMessage:
    text, hint = MESSAGES[code]
    return level(text.format(**params), hint=hint, id=f"llm_routing.{code}")


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        unknown = routing_settings.unknown_keys()
    except ImproperlyConfigured as exc:
        return [_message(checks.Error, "E002", detail=str(exc))]
    errors: list[checks.CheckMessage] = []
    if unknown:
        errors.append(_message(checks.Error, "E001", keys=", ".join(unknown)))
    user = routing_settings.user_settings
    for key in ("DEFAULT_CHAIN", "BREAKER_COOLDOWNS_S"):
        if key in user and not isinstance(user[key], list | tuple):
            errors.append(_message(checks.Error, "E002", detail=f"{key} must be a list"))
    for key in ("ROUTES", "PROVIDER_KINDS", "API_THROTTLE_RATES"):
        if key in user and not isinstance(user[key], dict):
            errors.append(_message(checks.Error, "E002", detail=f"{key} must be a dict"))
    for key, default in DEFAULTS.items():
        if (
            key in user
            and isinstance(default, int | float)
            and not isinstance(default, bool)
            and (not isinstance(user[key], int | float) or user[key] <= 0)
        ):
            errors.append(_message(checks.Error, "E002", detail=f"{key} must be a positive number"))
    if not unknown and not errors:
        from .resilience.breaker import Policy

        try:
            Policy.from_settings()
        except ImproperlyConfigured as exc:
            errors.append(_message(checks.Error, "E002", detail=str(exc).rstrip(".")))
    return errors


@checks.register(checks.Tags.security)
def check_http_debug_logging(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    noisy = [
        name
        for name in ("httpx", "httpcore")
        if logging.getLogger(name).isEnabledFor(logging.DEBUG)
    ]
    if noisy:
        return [_message(checks.Warning, "W010", loggers=", ".join(noisy))]
    return []
