"""The delay before a duplicate's retry (``on_duplicate="retry"``), with seeded generators so that
every delay can be predicted.

What is pinned here, and why:

* the first retry comes within a second, whatever the holder's TTL left says: a holder's TTL left
  is no estimate of when it finishes, since the watchdog keeps it near the full TTL;
* the delays then double (jittered) up to the TTL, so a short holder is retried within a few
  seconds and a long one costs one retry per half a TTL to a TTL;
* a retry budget too small to double all the way (Celery's ``max_retries``, 3 by default) grows
  faster, so that its last retry still waits up to a TTL instead of giving up within seconds;
* never later than just after a holder's key would expire on its own (a dead holder);
* many duplicates of one key come back spread out, not in lock-step.
"""

from __future__ import annotations

import math
import random

import pytest

from tasklock.guard import RETRY_FIRST_DELAY, Duplicate, Guard, duplicate_retry_delay

TTL = 30.0


def delay(
    attempt: int,
    seed: int = 0,
    *,
    ttl: float = TTL,
    holder_ttl: float | None = None,
    max_retries: int | None = None,
) -> float:
    return duplicate_retry_delay(
        attempt, ttl=ttl, holder_ttl=holder_ttl, rng=random.Random(seed), max_retries=max_retries
    )


def test_the_first_retry_comes_within_a_second_whatever_the_holders_ttl_left() -> None:
    # The watchdog keeps a running holder's TTL left between 20 and 30 s: waiting for it was the
    # bug.
    for seed in range(200):
        assert 0.5 <= delay(0, seed, holder_ttl=29.5) <= 1.0
    assert RETRY_FIRST_DELAY == 1.0


def test_delays_double_with_jitter_up_to_the_ttl() -> None:
    ceilings = [1, 2, 4, 8, 16, 30, 30, 30]
    for attempt, ceiling in enumerate(ceilings):
        rng = random.Random(attempt)
        expected = round(ceiling * (0.5 + 0.5 * rng.random()), 3)
        assert delay(attempt, attempt) == expected
        for seed in range(50):
            assert ceiling / 2 <= delay(attempt, seed) <= ceiling


def test_a_huge_attempt_number_stays_at_the_cap() -> None:
    # Celery's request.retries or RQ's meta can grow for ever with max_retries=None: no overflow.
    for attempt in (64, 1025, 10**6):
        assert TTL / 2 <= delay(attempt) <= TTL
        assert TTL / 2 <= delay(attempt, max_retries=3) <= TTL


def test_never_later_than_just_after_the_holders_key_would_expire() -> None:
    # A holder that died (no watchdog renews it) frees the lock when its key expires.
    # Spread over an eighth of the ceiling, so that waiters do not come back at one instant.
    late = [delay(10, seed, holder_ttl=3.0) - 3.0 for seed in range(100)]
    assert min(late) >= 0.25
    assert max(late) <= 0.25 + TTL / 8
    assert max(late) - min(late) >= TTL / 10
    for seed in range(100):
        assert 0.25 <= delay(10, seed, holder_ttl=0.0) <= 0.25 + TTL / 8
        assert 0.25 <= delay(2, seed, holder_ttl=0.0) <= 0.75  # the ceiling is 4 s
    # A live holder's TTL left (at least 2/3 of the TTL) does not shorten the early retries.
    for seed in range(100):
        assert delay(2, seed, holder_ttl=20.0) == delay(2, seed)


def test_a_short_ttl_still_waits_half_a_second_to_a_second() -> None:
    # ttl=0.2 would otherwise re-send the task every 0.1-0.2 s through the broker.
    for seed in range(50):
        assert 0.5 <= delay(7, seed, ttl=0.2) <= 1.0


@pytest.mark.parametrize(
    ("max_retries", "ceilings"),
    [
        (1, [30]),  # one retry: make it count
        (2, [1, 30]),
        (3, [1, math.sqrt(30), 30]),  # Celery's default: 1, 5.5, 30
        (4, [1, 30 ** (1 / 3), 30 ** (2 / 3), 30]),
        (6, [1, 2, 4, 8, 16, 30]),  # enough to double all the way
        (50, [1, 2, 4, 8, 16, 30, 30]),
    ],
)
def test_a_small_retry_budget_grows_faster_so_its_last_retry_waits_up_to_the_ttl(
    max_retries: int, ceilings: list[float]
) -> None:
    for attempt, ceiling in enumerate(ceilings):
        for seed in range(50):
            got = delay(attempt, seed, max_retries=max_retries)
            assert ceiling / 2 - 0.001 <= got <= ceiling + 0.001, (attempt, seed)


def retries_to_outwait(
    holder_runs: float, rng: random.Random, max_retries: int | None = None
) -> tuple[int, float]:
    """Retries a duplicate makes until the first one after the holder released (``holder_runs``
    seconds after they met), and how late that retry came after the release."""
    waited, attempt = 0.0, 0
    while waited < holder_runs:
        waited += duplicate_retry_delay(
            attempt, ttl=TTL, holder_ttl=rng.uniform(2 * TTL / 3, TTL), rng=rng,
            max_retries=max_retries,
        )  # fmt: skip
        attempt += 1
    return attempt, waited - holder_runs


#: The README's bound: the most retries a duplicate makes to outwait a holder that runs this many
#: more seconds after they met (TTL 30 s, no retry budget).
BOUND = [(0.5, 1), (1.5, 2), (3.5, 3), (7.5, 4), (15.5, 5), (30.5, 6), (60.5, 8), (300.5, 24)]


@pytest.mark.parametrize(("holder_runs", "most_retries"), BOUND)
def test_retries_and_lateness_are_bounded_by_the_holders_run(
    holder_runs: float, most_retries: int
) -> None:
    rng = random.Random(holder_runs)
    for _ in range(500):
        retries, late = retries_to_outwait(holder_runs, rng)
        assert retries <= most_retries
        # Late by at most twice the holder's run plus a second, and never more than a TTL.
        assert late <= min(TTL, 2 * holder_runs + 1.0) + 0.001


def test_a_two_second_holder_costs_two_or_three_retries_and_a_few_seconds() -> None:
    """The issue's case: the duplicate used to wait the holder's TTL left (~25-30 s)."""
    rng = random.Random(2)
    for max_retries in (None, 3):
        outcomes = [retries_to_outwait(2.0, rng, max_retries) for _ in range(500)]
        assert max(retries for retries, _ in outcomes) <= 3
        assert max(late for _, late in outcomes) <= 5.0


def test_many_duplicates_of_one_key_come_back_spread_out() -> None:
    """No stampede: 400 duplicates that met one live holder at the same moment (so all saw the
    same TTL left, 20 s, the least the watchdog leaves of 30 s) come back spread over the range
    they draw from: no tenth of it holds more than 30 % of them, no 40th more than 12 %."""
    rng = random.Random(20)  # one generator, as the guard's: drawn in turn by every duplicate
    for attempt, ceiling in ((0, 1.0), (3, 8.0), (9, TTL)):
        delays = [
            duplicate_retry_delay(attempt, ttl=TTL, holder_ttl=20.0, rng=rng) for _ in range(400)
        ]
        low = ceiling / 2
        assert min(delays) >= low
        assert max(delays) <= ceiling
        buckets = [0] * 10
        for d in delays:
            buckets[min(9, int((d - low) / (ceiling - low) * 10))] += 1
        assert max(buckets) <= 120, (attempt, buckets)
        assert max(delays) - min(delays) >= 0.5 * (ceiling - low)
        # No cluster: a 40th of the range (12.5 ms to 375 ms) holds at most 12 % (uniform: 2.5 %;
        # a clamp to "the holder's TTL left + 0.25-0.5 s" put 59 % into one).
        width = (ceiling - low) / 40
        assert max(sum(d <= x < d + width for x in delays) for d in delays) <= 48, attempt


def test_the_guard_applies_the_rule_with_its_ttl_and_own_generator() -> None:
    guard = Guard(lambda account: None, "app.retry_delay", {"ttl": 10, "url": "redis://h:1/0"})
    duplicate = Duplicate("app.retry_delay", "k", "pid=1", holder_ttl=9.5)
    state = random.getstate()
    assert 0.5 <= guard.retry_delay(duplicate, attempt=0) <= 1.0
    assert 5.0 <= guard.retry_delay(duplicate, attempt=12) <= 10.0  # capped at this task's TTL
    assert 5.0 <= guard.retry_delay(duplicate, attempt=1, max_retries=2) <= 10.0  # the last one
    assert random.getstate() == state, "the jitter leaves the application's random stream"
