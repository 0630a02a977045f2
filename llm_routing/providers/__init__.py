"""Provider adapters: one module per kind over :mod:`.base`, looked up in :mod:`.registry`."""

from .base import BaseProvider
from .registry import get_adapter, get_adapter_class, is_known_kind, known_kinds, register

__all__ = [
    "BaseProvider",
    "get_adapter",
    "get_adapter_class",
    "is_known_kind",
    "known_kinds",
    "register",
]
