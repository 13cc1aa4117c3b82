"""Backoff math, with a seeded random generator so every delay can be predicted exactly."""

from __future__ import annotations

import random

import pytest

from tasklock.core.backoff import Backoff


def expected_delays(initial: float, cap: float, seed: int, count: int) -> list[float]:
    rng = random.Random(seed)
    return [min(cap, initial * 2**k) * (0.5 + 0.5 * rng.random()) for k in range(count)]


def test_delays_double_with_full_jitter_up_to_the_cap() -> None:
    backoff = Backoff(0.1, 1.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(8)]
    assert delays == pytest.approx(expected_delays(0.1, 1.0, 7, 8))
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling


def test_first_delay_is_at_most_the_initial_sleep() -> None:
    for seed in range(200):
        delay = Backoff(0.25, 10.0, rng=random.Random(seed)).next_delay()
        assert 0.125 <= delay <= 0.25


def test_cap_holds_for_ever_without_overflow() -> None:
    # A waiter on a lock held for hours polls thousands of times; 2**1024 is not a float.
    backoff = Backoff(0.1, 1.0, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(5000)]
    assert max(delays) <= 1.0
    assert min(delays[10:]) >= 0.5


def test_cap_below_initial_is_raised_to_initial() -> None:
    backoff = Backoff(30.0, 1.0, rng=random.Random(3))
    assert backoff.cap == 30.0
    assert all(15.0 <= backoff.next_delay() <= 30.0 for _ in range(20))


@pytest.mark.parametrize("initial", [0.0, -1.0])
def test_initial_must_be_positive(initial: float) -> None:
    with pytest.raises(ValueError, match="initial"):
        Backoff(initial, 1.0)


def test_remaining_time_clamps_the_delay() -> None:
    backoff = Backoff(10.0, 10.0, rng=random.Random(5))
    assert backoff.next_delay(remaining=0.3) == 0.3
    assert backoff.next_delay(remaining=0.0) == 0.0
    assert backoff.next_delay(remaining=-2.0) == 0.0  # never negative


def test_holder_ttl_clamps_the_delay_to_just_after_expiry() -> None:
    for seed in range(100):
        delay = Backoff(30.0, 30.0, rng=random.Random(seed)).next_delay(holder_ttl=2.0)
        assert 2.001 <= delay <= 2.011


def test_holder_ttl_and_remaining_together_take_the_smaller() -> None:
    backoff = Backoff(30.0, 30.0, rng=random.Random(9))
    assert backoff.next_delay(remaining=1.0, holder_ttl=2.0) == 1.0
    assert backoff.next_delay(remaining=5.0, holder_ttl=0.5) <= 0.511


@pytest.mark.parametrize("holder_ttl", [None, -1.0])
def test_unknown_holder_ttl_is_ignored(holder_ttl: float | None) -> None:
    delays = [
        Backoff(0.1, 1.0, rng=random.Random(11)).next_delay(holder_ttl=holder_ttl) for _ in range(3)
    ]
    assert delays == pytest.approx(expected_delays(0.1, 1.0, 11, 1) * 3)


def test_holder_ttl_of_zero_retries_almost_at_once() -> None:
    delay = Backoff(1.0, 1.0, rng=random.Random(2)).next_delay(holder_ttl=0.0)
    assert 0.001 <= delay <= 0.011
