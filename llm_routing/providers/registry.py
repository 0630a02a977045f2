"""Kind → adapter class registry.

Built-in kinds map to modules of this package; more kinds come from
``LLM_ROUTING["PROVIDER_KINDS"]`` (``{"kind": "dotted.path.Class"}``) or from
:func:`register`. Adapter instances are pooled per provider configuration
(name + row version + model) so HTTP clients are reused across requests and threads
and rebuilt when the provider row changes (an evicted adapter's clients are closed: the
sync one at once, each async one on its own event loop). :func:`aclose_all` is the
shutdown hook of async servers (an ASGI lifespan shutdown). Nothing outside this module touches its
dictionaries.
"""

from __future__ import annotations

import threading

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ..conf import routing_settings
from ..types import ProviderConfig
from .base import BaseProvider

__all__ = [
    "BUILTIN_KINDS",
    "aclose_all",
    "clear_adapter_cache",
    "get_adapter",
    "get_adapter_class",
    "is_known_kind",
    "known_kinds",
    "register",
]

BUILTIN_KINDS: dict[str, str] = {
    "mock": "llm_routing.providers.mock.MockProvider",
    "openai": "llm_routing.providers.openai.OpenAIProvider",
    "openai_compatible": "llm_routing.providers.openai_compatible.OpenAICompatibleProvider",
    "anthropic": "llm_routing.providers.anthropic.AnthropicProvider",
    "gemini": "llm_routing.providers.gemini.GeminiProvider",
}

_registered: dict[str, type[BaseProvider]] = {}
_instances: dict[tuple[str, str, str, str], BaseProvider] = {}
_lock = threading.Lock()


def register(kind: str, adapter_class: type[BaseProvider]) -> None:
    """Register a custom adapter class under ``kind`` (overrides a built-in)."""
    if not (isinstance(adapter_class, type) and issubclass(adapter_class, BaseProvider)):
        raise ImproperlyConfigured(f"{adapter_class!r} is not a BaseProvider subclass.")
    with _lock:
        _registered[kind] = adapter_class
    clear_adapter_cache()


def _paths() -> dict[str, str]:
    paths = dict(BUILTIN_KINDS)
    paths.update(routing_settings.PROVIDER_KINDS or {})
    return paths


def known_kinds() -> list[str]:
    return sorted(set(_paths()) | set(_registered))


def is_known_kind(kind: str) -> bool:
    return kind in _registered or kind in _paths()


def get_adapter_class(kind: str) -> type[BaseProvider]:
    if kind in _registered:
        return _registered[kind]
    path = _paths().get(kind)
    if path is None:
        raise ImproperlyConfigured(f"Unknown provider kind {kind!r}.")
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"Cannot import adapter {path!r} for kind {kind!r}.") from exc
    if not (isinstance(cls, type) and issubclass(cls, BaseProvider)):
        raise ImproperlyConfigured(f"{path!r} (kind {kind!r}) is not a BaseProvider subclass.")
    return cls


def get_adapter(config: ProviderConfig) -> BaseProvider:
    """The pooled adapter for this configuration; mock-mode rows get the mock adapter."""
    kind = "mock" if config.mode == "mock" else config.kind
    key = (config.name, kind, config.version, config.model)
    adapter = _instances.get(key)
    if adapter is not None:
        return adapter
    cls = get_adapter_class(kind)
    with _lock:
        adapter = _instances.get(key)
        if adapter is None:
            stale = [k for k in _instances if k[0] == config.name and k[2] != config.version]
            for k in stale:
                _instances.pop(k).close()
            adapter = cls(config)
            _instances[key] = adapter
    return adapter


def clear_adapter_cache() -> None:
    with _lock:
        for adapter in _instances.values():
            adapter.close()
        _instances.clear()


async def aclose_all() -> None:
    """Close every pooled adapter from async code — the shutdown hook of an async server
    (ASGI lifespan ``shutdown``): the running loop's async clients are closed and waited
    for, the rest as in :func:`clear_adapter_cache`. Adapters are rebuilt on next use."""
    with _lock:
        adapters = list(_instances.values())
        _instances.clear()
    for adapter in adapters:
        await adapter.aclose()
