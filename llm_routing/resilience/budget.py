"""One request-wide deadline and attempt budget for a whole routed request.

Hand-written on purpose: no retry library (tenacity, backoff, stamina) models a budget
shared by several callees — retries on one provider and the walk over the next
candidates draw on the same deadline and the same attempt count, so retries times
candidates can never multiply into a storm.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["MIN_ATTEMPT_S", "Budget"]

#: An attempt is not started with less time than this left before the deadline.
MIN_ATTEMPT_S = 0.05


class Budget:
    def __init__(
        self,
        *,
        deadline_s: float,
        max_attempts: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.started = clock()
        self.deadline = self.started + deadline_s
        self.max_attempts = max_attempts
        self.attempts_used = 0

    def remaining(self) -> float:
        return max(0.0, self.deadline - self._clock())

    def can_start(self) -> bool:
        """True when an attempt may start: attempts left and time for it to finish."""
        return self.attempts_used < self.max_attempts and self.remaining() >= MIN_ATTEMPT_S

    def take(self) -> None:
        self.attempts_used += 1

    def timeout_for(self, wanted: float) -> float:
        """Clamp an attempt's own timeout so the attempt ends inside the deadline."""
        return max(0.0, min(wanted, self.remaining()))

    def can_wait(self, delay: float) -> bool:
        """True when sleeping ``delay`` still leaves time for one more attempt."""
        return self.remaining() - delay >= MIN_ATTEMPT_S
