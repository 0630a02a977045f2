"""Where upstream-reported usage enters: :func:`reported_tokens`, the one function every
adapter's token counts pass through (a whole answer's ``usage``, a stream's usage
events, the usage of a failed answer).

An upstream's count is trusted for the budgets and the cost, so it is bounded here: a
count above ``LLM_ROUTING["MAX_REPORTED_TOKENS"]`` (default 10,000,000, above any
context window sold today) is counted as that maximum, with a WARNING on
``llm_routing.providers`` (the count's field and the maximum: no key, no prompt, not
the absurd number itself). Without the bound a broken or hostile upstream reporting
10**30 tokens would lock a user's or a global tokens budget until its window ends.
"""

from __future__ import annotations

import logging

from ..conf import routing_settings

__all__ = ["reported_tokens"]

logger = logging.getLogger("llm_routing.providers")


def reported_tokens(value: object, *, field: str) -> int | None:
    """An upstream's token count: a non-negative integer (not a bool) clamped to
    ``MAX_REPORTED_TOKENS``; None for anything else (absent, negative, a float, text).
    ``field`` names the count in the warning (``input_tokens``, ``output_tokens``)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return None
    ceiling = int(routing_settings.MAX_REPORTED_TOKENS)
    if value > ceiling:
        logger.warning(
            "An upstream reported more %s than MAX_REPORTED_TOKENS; counted as %d.",
            field,
            ceiling,
        )
        return ceiling
    return value
