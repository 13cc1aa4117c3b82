"""What a duplicate call is, as the task layer reports it, and when its retry is worth trying.

Kept apart from :mod:`tasklock.guard` (which applies the policy) because both adapters and the
guard use these, and the retry arithmetic is pure: it has its own unit tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from tasklock.core.backoff import backoff_ceiling, half_jitter

__all__ = ["RETRY_FIRST_DELAY", "Duplicate", "duplicate_retry_delay"]

#: Ceiling of the first retry of a duplicate (``on_duplicate="retry"``): it comes 0.5-1 s after the
#: call met its holder; every later one may wait twice as long, up to the TTL.
RETRY_FIRST_DELAY = 1.0

#: A retry is due at least this long after the holder's key would expire on its own.
_EXPIRY_GRACE = 0.25


def duplicate_retry_delay(
    attempt: int,
    *,
    ttl: float,
    holder_ttl: float | None,
    rng: random.Random,
    max_retries: int | None = None,
) -> float:
    """Seconds before a duplicate's retry, ``attempt`` being the retries it made before (0 first).

    Not the holder's TTL left (the rule this replaced): the watchdog renews a running holder at a
    third of its TTL, so its TTL left stays near the full TTL and says only that the holder is
    alive, never when it finishes. Waiting for it made a duplicate of a holder done in 2 s wait
    about one TTL. Nothing else predicts a holder's end either (its age comes from another host's
    clock), so the retries probe, in capped exponential backoff:

    * the ceiling starts at :data:`RETRY_FIRST_DELAY` (1 s) and doubles per attempt up to the TTL
      (at least that first second): a short holder is retried within a few seconds, a long one
      costs a retry per half a TTL to a TTL. To outwait a holder that runs ``D`` more seconds a
      duplicate makes at most ``ceil(log2(2D + 1))`` retries while ``D`` is below the TTL, and
      comes at most ``min(TTL, 2D + 1)`` seconds after the release;
    * ``max_retries`` (Celery's, which these retries count against; None = no limit) too small to
      double all the way grows the ceiling faster, by ``(TTL / 1 s) ** (1 / (max_retries - 1))``,
      so that the last retry allowed still waits up to a TTL instead of the budget running out
      within seconds of meeting a holder (Celery's default 3: ceilings 1 s, 5.5 s, 30 s);
    * the delay is drawn between half the ceiling and the ceiling from ``rng``: duplicates that
      met one holder together come back spread over that range, not in lock-step, and the half
      that is certain keeps the number of retries bounded;
    * never later than :data:`_EXPIRY_GRACE` plus up to an eighth of the ceiling after
      ``holder_ttl`` (the holder's TTL left, None when unknown): a holder that died frees the
      lock when its key expires. A live holder's TTL left (at least two thirds of the TTL, as the
      watchdog renews it) leaves the early retries alone.
    """
    cap = max(ttl, RETRY_FIRST_DELAY)
    growth = 2.0
    if max_retries is not None and max_retries > 1:
        growth = max(growth, (cap / RETRY_FIRST_DELAY) ** (1.0 / (max_retries - 1)))
    if max_retries is not None and max_retries <= 1:
        ceiling = cap
    else:
        ceiling = backoff_ceiling(RETRY_FIRST_DELAY, cap, attempt, growth)
    delay = half_jitter(ceiling, rng)
    if holder_ttl is not None:
        # Drawn too, or every duplicate past the key's expiry would come back at one instant.
        expired = max(0.0, holder_ttl) + _EXPIRY_GRACE + ceiling / 8 * rng.random()
        delay = min(delay, expired)
    return round(delay, 3)


@dataclass(frozen=True)
class Duplicate:
    """A call that found its twin holding the lock (with ``limit`` > 1: every permit taken; the
    holder named is the one whose permit frees first)."""

    task_name: str
    key: str
    holder: str
    holder_ttl: float | None
    waited: bool = False
    limit: int = 1

    def message(self) -> str:
        ttl = "unknown" if self.holder_ttl is None else f"{self.holder_ttl:.1f}s"
        how = "after waiting, " if self.waited else ""
        if self.limit > 1:
            return (
                f"{self.task_name}: {how}all {self.limit} calls allowed at once with the same "
                f"key are running (key={self.key}, first to free: {self.holder}, its TTL left: "
                f"{ttl})"
            )
        return (
            f"{self.task_name}: {how}a call with the same key is running "
            f"(key={self.key}, holder: {self.holder}, lock TTL left: {ttl})"
        )

    def as_meta(self) -> dict[str, Any]:
        """JSON-friendly description for task state / job meta."""
        meta = {
            "reason": "duplicate",
            "task": self.task_name,
            "key": self.key,
            "holder": self.holder,
            "holder_ttl": self.holder_ttl,
            "waited": self.waited,
        }
        if self.limit > 1:
            meta["limit"] = self.limit
        return meta
