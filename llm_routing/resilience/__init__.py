"""Retry/backoff with a request-wide deadline and attempt budget; circuit breakers."""

from .budget import Budget
from .retry import call_with_retries

__all__ = ["Budget", "call_with_retries"]
