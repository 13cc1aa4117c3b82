"""Jittered exponential backoff for waiting on a held lock.

Waiters are woken by the release (see :mod:`tasklock.core.wakeup`); polling remains only as the
fallback for a missed wake-up or a holder that died without releasing. "Full jitter" spreads
waiters so that they do not retry in lock-step.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

__all__ = ["Backoff", "backoff_ceiling", "half_jitter"]


def backoff_ceiling(initial: float, cap: float, attempt: int, growth: float = 2.0) -> float:
    """``initial * growth ** attempt``, at most ``cap``: the longest wait of attempt ``attempt``
    (0 first). Compared in logarithms: ``growth ** attempt`` overflows a float long before a
    waiter on a lock held for hours stops counting."""
    cap = max(cap, initial)
    if attempt <= 0:
        return initial
    if attempt * math.log(growth) >= math.log(cap / initial):
        return cap
    return min(cap, initial * growth**attempt)


def half_jitter(ceiling: float, rng: random.Random) -> float:
    """A wait between half ``ceiling`` and ``ceiling``: waiters that started together come back
    spread out, not in lock-step, and the half that is certain bounds how many waits it takes."""
    return ceiling * (0.5 + 0.5 * rng.random())


@dataclass
class Backoff:
    """Delays that start at ``initial`` seconds and double up to ``cap``, each fully jittered.

    ``holder_ttl`` lets a waiter sleep no longer than the holder's remaining TTL: when the holder
    dies without releasing, the key expires then and nobody publishes a wake-up.
    """

    initial: float
    cap: float
    rng: random.Random = field(default_factory=random.Random)
    _attempt: int = 0

    def __post_init__(self) -> None:
        if self.initial <= 0:
            raise ValueError(f"backoff initial delay must be > 0, got {self.initial!r}")
        self.cap = max(self.cap, self.initial)

    def next_delay(self, remaining: float | None = None, holder_ttl: float | None = None) -> float:
        """The next wait, never beyond ``remaining`` (the caller's deadline) and never negative."""
        ceiling = backoff_ceiling(self.initial, self.cap, self._attempt)
        self._attempt += 1
        delay = half_jitter(ceiling, self.rng)
        if holder_ttl is not None and holder_ttl >= 0:
            # Wake a hair after the holder's key would expire on its own.
            delay = min(delay, holder_ttl + 0.001 + 0.01 * self.rng.random())
        if remaining is not None:
            delay = min(delay, remaining)
        return max(0.0, float(delay))
