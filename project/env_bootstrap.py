"""Routing seeds from the environment, for the demo project's settings only.

    LLM_PROVIDER_CHAIN="openai,anthropic"            -> LLM_ROUTING["DEFAULT_CHAIN"]
    LLM_ROUTING_RULES="vision=openai,anthropic;cheap=mock"  -> LLM_ROUTING["ROUTES"]
    LLM_PROVIDER="openai"   (chain unset)             -> DEFAULT_CHAIN == ["openai"]

The router uses these only when the database has no default chain (DEFAULT_CHAIN) or
no enabled rule matches a request's route (ROUTES). Malformed values raise
ImproperlyConfigured at start-up naming the variable and the bad part; the value of a
variable is shown only in the part that is wrong (these hold provider names, never keys).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured

__all__ = ["parse_provider_list", "parse_routes", "routing_from_env"]

NAME_RE = re.compile(r"[-a-zA-Z0-9_]{1,64}")
CHAIN_VAR = "LLM_PROVIDER_CHAIN"
PROVIDER_VAR = "LLM_PROVIDER"
RULES_VAR = "LLM_ROUTING_RULES"


def _fail(var: str, part: str, problem: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{var}: {problem} (bad part: {part!r}).")


def parse_provider_list(var: str, value: str) -> list[str]:
    """``"a, b,c"`` → ``["a", "b", "c"]``; empty or blank → ``[]``."""
    if not value.strip():
        return []
    names: list[str] = []
    for position, raw in enumerate(value.split(","), start=1):
        name = raw.strip()
        if not name:
            raise _fail(var, value, f"provider name #{position} is empty")
        if not NAME_RE.fullmatch(name):
            raise _fail(
                var, name, "provider names are 1-64 letters, digits, '-' or '_', comma-separated"
            )
        if name in names:
            raise _fail(var, name, "provider listed twice")
        names.append(name)
    return names


def parse_routes(var: str, value: str) -> dict[str, list[str]]:
    """``"vision=openai,anthropic;cheap=mock"`` → ``{"vision": [...], "cheap": ["mock"]}``.

    A single trailing ``;`` is allowed; every other part must be ``route=provider[,…]``.
    """
    text = value.strip()
    if not text:
        return {}
    if text.endswith(";"):
        text = text[:-1]
    routes: dict[str, list[str]] = {}
    for part in text.split(";"):
        route, sep, providers = part.partition("=")
        route = route.strip()
        if not sep:
            raise _fail(var, part, "expected route=provider[,provider…]")
        if not NAME_RE.fullmatch(route):
            raise _fail(var, part, "route keys are 1-64 letters, digits, '-' or '_'")
        if route in routes:
            raise _fail(var, part, f"route {route!r} is given twice")
        names = parse_provider_list(var, providers)
        if not names:
            raise _fail(var, part, f"route {route!r} names no provider")
        routes[route] = names
    return routes


def routing_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``DEFAULT_CHAIN`` and ``ROUTES`` entries of ``LLM_ROUTING``.

    ``LLM_PROVIDER`` alone behaves exactly as a one-provider ``LLM_PROVIDER_CHAIN``;
    when both are set, ``LLM_PROVIDER`` must be the chain's first provider.
    """
    chain = parse_provider_list(CHAIN_VAR, environ.get(CHAIN_VAR, ""))
    single = environ.get(PROVIDER_VAR, "").strip()
    if single:
        if not NAME_RE.fullmatch(single):
            raise _fail(
                PROVIDER_VAR,
                single,
                f"one provider name (letters, digits, '-', '_'); use {CHAIN_VAR} for a list",
            )
        if not chain:
            chain = [single]
        elif chain[0] != single:
            raise _fail(
                PROVIDER_VAR,
                single,
                f"conflicts with {CHAIN_VAR}, whose first provider is {chain[0]!r}; "
                "set only one of them",
            )
    return {
        "DEFAULT_CHAIN": chain,
        "ROUTES": parse_routes(RULES_VAR, environ.get(RULES_VAR, "")),
    }
