"""Human words for the raw values the admin shows (skip reasons, error categories,
circuit states, outcomes, column names): ``words("half_open")`` → ``"half open
(probing)"``. The admin shows the words with the raw value in a tooltip
(:func:`term`), where an operator needs the exact token to grep logs or the API."""

from __future__ import annotations

from django.utils.html import format_html
from django.utils.safestring import SafeString

__all__ = ["WORDS", "term", "words"]

WORDS: dict[str, str] = {
    # circuit states
    "closed": "closed (healthy)",
    "open": "open (skipped)",
    "half_open": "half open (probing)",
    # attempt outcomes and decision statuses
    "ok": "answered",
    "error": "failed",
    "skipped": "skipped",
    # skip reasons
    "missing_key": "key missing",
    "disabled": "disabled",
    "circuit_open": "circuit open",
    "unknown_provider": "unknown provider",
    "not_allowed": "not allowed for this user",
    "unsupported": "cannot serve this request",
    "drained": "drained (weight 0)",
    "context_too_small": "context window too small",
    "dimension_mismatch": "other embedding dimension",
    "deadline": "out of time",
    "attempt_budget": "out of attempts",
    "cost_cap": "over a budget's cap",
    # error categories
    "rate_limit": "rate limited",
    "unavailable": "unavailable",
    "network": "network error",
    "timeout": "timed out",
    "context_length": "input too long",
    "authentication": "key refused",
    "invalid_request": "invalid request",
    "content_policy": "content policy",
    "response": "bad response",
    "chain_exhausted": "no provider could answer",
    "client_disconnected": "client went away",
    # router modes
    "explicit": "provider first",
    "chain": "chain by name",
    "default": "default chain",
    "rule": "rule",
    "forced": "forced provider",
    # columns
    "input_tokens": "Input tokens",
    "output_tokens": "Output tokens",
    "cost_usd": "Cost (USD)",
    # provider modes
    "live": "live",
    "mock": "mock (offline)",
}


def words(raw: object) -> str:
    """The human words for ``raw`` (the value itself, with ``_`` as spaces, when unknown)."""
    text = "" if raw is None else str(raw)
    return WORDS.get(text, text.replace("_", " "))


def term(raw: object) -> SafeString:
    """The words, with the raw value in a tooltip (``<span title="half_open">``)."""
    text = "" if raw is None else str(raw)
    if not text:
        return format_html("{}", "—")
    shown = words(text)
    if shown == text:
        return format_html("{}", text)
    return format_html('<span class="llmr-term" title="{}">{}</span>', text, shown)
