"""The package version (one place: the package facade and the adapters' user agent read it)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
