"""The request-wide deadline and attempt budget (fake clock: no sleeping)."""

from __future__ import annotations

from llm_routing.resilience.budget import MIN_ATTEMPT_S, Budget


def make(deadline: float = 10.0, attempts: int = 3) -> tuple[Budget, list[float]]:
    now = [100.0]
    return Budget(deadline_s=deadline, max_attempts=attempts, clock=lambda: now[0]), now


def test_attempts_are_counted() -> None:
    b, _ = make(attempts=2)
    assert b.can_start()
    b.take()
    b.take()
    assert not b.can_start()


def test_deadline() -> None:
    b, now = make(deadline=10.0)
    assert b.remaining() == 10.0
    now[0] += 9.99
    assert b.remaining() < MIN_ATTEMPT_S
    assert not b.can_start()  # an attempt that cannot finish is never started
    now[0] += 5
    assert b.remaining() == 0.0


def test_timeout_for_clamps_to_the_remaining_time() -> None:
    b, now = make(deadline=10.0)
    assert b.timeout_for(30.0) == 10.0
    assert b.timeout_for(4.0) == 4.0
    now[0] += 8
    assert b.timeout_for(4.0) == 2.0


def test_can_wait_leaves_room_for_an_attempt() -> None:
    b, _ = make(deadline=3.0)
    assert b.can_wait(2.0)
    assert not b.can_wait(3.0 - MIN_ATTEMPT_S / 2)
