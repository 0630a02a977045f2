"""Circuit breakers per (provider, model) — placeholder until issue #4 lands.

The router already asks :func:`allow` before a candidate (skip reason
``circuit_open``) and reports every real call to :func:`observe`, so the breaker can
be filled in without touching the walk. Until then every circuit is closed.
"""

from __future__ import annotations

from ..types import ProviderConfig, ProviderResult

__all__ = ["allow", "observe"]


def allow(config: ProviderConfig) -> bool:
    """Whether a call to this (provider, model) may start now."""
    return True


def observe(config: ProviderConfig, result: ProviderResult) -> None:
    """Feed one finished call (after retries) into the breaker."""
    return None
