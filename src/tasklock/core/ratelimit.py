"""``tasklock.RateLimit``: at most N calls per period per key, across every process and host.

One script call per admission (:data:`tasklock.core.rate_scripts.RATE`), on the server's clock;
the rules (parsing, what the script is asked, what its answer means) are in
:mod:`tasklock.core.rates`, shared with :class:`tasklock.asyncio.RateLimit`.
"""

from __future__ import annotations

import time
from typing import Any

from redis.exceptions import ResponseError

from tasklock.core.connection import backend_errors
from tasklock.core.lease import check_seconds
from tasklock.core.rate_scripts import RATE
from tasklock.core.rates import Admission, RatePlan, micros
from tasklock.errors import ConfigurationError

__all__ = ["RateLimit", "check_rate_name"]


def check_rate_name(name: Any) -> str:
    """The key of a rate limit, as given (text or UTF-8 bytes), or a ConfigurationError."""
    if isinstance(name, bytes):
        try:
            name = name.decode()
        except UnicodeDecodeError:
            raise ConfigurationError(
                f"name must be text or UTF-8 bytes, got {name!r}: pass the rate limit's name as "
                "a str"
            ) from None
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"name must be a non-empty string, got {name!r}")
    return name


class RateLimitBase:
    """What the blocking and the asyncio RateLimit share: the plan, the key, the arguments."""

    def __init__(self, redis: Any, name: str, rate: Any, burst: Any = 1) -> None:
        if redis is None or not hasattr(redis, "execute_command"):
            raise ConfigurationError(
                f"redis must be a redis-py client (redis.Redis), got {type(redis).__name__}"
            )
        self.redis = redis
        #: The key of this limit (a hash of one timestamp per rate; it expires when idle).
        self.name = check_rate_name(name)
        self.plan = RatePlan.of(rate, burst)
        self._doing = f"rate limiting {self.name!r}"

    @property
    def rate(self) -> tuple[str, ...]:
        return tuple(str(r) for r in self.plan.rates)

    @property
    def burst(self) -> tuple[int, ...]:
        return self.plan.bursts

    def _call(
        self, max_wait: float | None, reservation: str | None, keep: float, early: float | None
    ) -> tuple[list[str], list[Any]]:
        keys = [self.name] if reservation is None else [self.name, reservation]
        keep_ms = 0 if reservation is None else max(1, round(keep * 1000))
        return keys, [micros(max_wait), keep_ms, micros(early), *self.plan.args]

    @staticmethod
    def _check_wait(blocking: bool, blocking_timeout: float | None) -> float | None:
        if not isinstance(blocking, bool):
            raise ConfigurationError(f"blocking must be True or False, got {blocking!r}")
        check_seconds("blocking_timeout", blocking_timeout, allow_none=True, allow_zero=True)
        if not blocking:
            return 0.0
        return None if blocking_timeout is None else float(blocking_timeout)

    def _wrong_type(self, exc: ResponseError) -> ConfigurationError | None:
        """A clear error for a name whose key holds something else (a lock, a permit set)."""
        if "WRONGTYPE" not in str(exc):
            return None
        return ConfigurationError(
            f"rate limit {self.name!r}: the key {self.name!r} holds another kind of value (a "
            "lock, a semaphore, or data of your own), not a rate limit's hash: give the rate "
            "limit a name of its own"
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.plan.describe()}>"


class RateLimit(RateLimitBase):
    """At most ``rate`` calls per period on ``name``, for every process that uses that name.

    ::

        stripe = tasklock.RateLimit(redis, "stripe-api", rate="100/s")
        if stripe.try_acquire():             # truthy when allowed; .retry_after, .remaining
            call_stripe()
        stripe.acquire(blocking_timeout=5)   # sleeps until its slot: True; False past the timeout

    ``rate`` is one rate (``"10/s"``, ``"20/m"``, ``"100/h"``, ``"100000/d"``, ``"30/5m"``) or a
    list applied together; ``burst`` (default 1: evenly spaced) is one int for all or a list
    that matches ``rate``. The limit's parameters travel with every call, so they may change
    between calls (the state is the limits' timestamps, which carry over). The counting is the
    server's: one script, one round trip, the server's clock.
    """

    def try_acquire(self) -> Admission:
        """One call now, if every limit admits it: a truthy :class:`Admission`. Refused: a falsy
        one whose ``retry_after`` says when to try again (nothing was consumed)."""
        return self.admit(0.0)

    def acquire(self, blocking: bool = True, blocking_timeout: float | None = None) -> bool:
        """Take this call's slot and sleep until it: True. False, consuming nothing, when the slot
        is further away than ``blocking_timeout`` (None: any wait; ``blocking=False``: no wait).

        The slot is reserved in the same round trip that finds it, so waiters are served in the
        order they asked, with no polling and no herd; a caller interrupted in its sleep leaves
        its slot unused (lost capacity, never an extra call).
        """
        admission = self.admit(self._check_wait(blocking, blocking_timeout))
        if admission and admission.retry_after > 0:
            time.sleep(admission.retry_after)
        return admission.allowed

    def admit(
        self,
        max_wait: float | None,
        *,
        reservation: str | None = None,
        keep: float = 0.0,
        early: float | None = None,
    ) -> Admission:
        """The one round trip under every method: admit a call whose slot is at most ``max_wait``
        seconds away (None: any), without sleeping. With ``reservation`` (a key in the limit's
        cluster slot) a call whose slot is further is deferred instead of refused: its slot is
        kept there for ``keep`` seconds past the slot, and a later call with the same key is
        admitted at that slot (the task layer's ``on_rate_limit="retry"``): at once when the slot
        has passed, and after a wait when it is at most ``early`` seconds away (None: any).
        Further away, it is deferred again, reservation kept."""
        keys, args = self._call(max_wait, reservation, keep, early)
        try:
            with backend_errors(self.redis, self._doing, keys):
                reply = RATE(self.redis, keys, args)
        except ResponseError as exc:
            raise self._wrong_type(exc) or exc from None
        return Admission.from_reply(reply)

    def reset(self) -> None:
        """Forget every call made so far (the next calls see an idle limit)."""
        with backend_errors(self.redis, f"resetting rate limit {self.name!r}", [self.name]):
            self.redis.delete(self.name)
