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

__all__ = ["SAME_AS_MAX_WAIT", "RateLimit", "check_rate_name"]

#: ``admit(early=...)``'s default: a call that finds its reservation waits as long as ``max_wait``.
SAME_AS_MAX_WAIT: Any = object()


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
        self, max_wait: float | None, reservation: str | None, keep: float, early: Any
    ) -> tuple[list[str], list[Any]]:
        keys = [self.name] if reservation is None else [self.name, reservation]
        keep_ms = 0 if reservation is None or keep <= 0 else max(1, round(keep * 1000))
        if early is SAME_AS_MAX_WAIT:
            early = max_wait
        return keys, [micros(max_wait), keep_ms, micros(early), *self.plan.args]

    @staticmethod
    def _check_wait(blocking: bool, blocking_timeout: float | None) -> float | None:
        if not isinstance(blocking, bool):
            raise ConfigurationError(f"blocking must be True or False, got {blocking!r}")
        check_seconds("blocking_timeout", blocking_timeout, allow_none=True, allow_zero=True)
        if not blocking:
            return 0.0
        return None if blocking_timeout is None else float(blocking_timeout)

    def _wrong_type(self, keys: list[str], types: list[Any]) -> ConfigurationError:
        """A clear error for a key that holds something else (a lock, a permit set, your data),
        naming it: ``types`` are the keys' TYPEs, read after the script met WRONGTYPE."""
        expected = ("hash", "string")  # the limit's hash; a reservation's string
        names = [t.decode() if isinstance(t, bytes) else str(t) for t in types]
        for key, found, wanted in zip(keys, names, expected, strict=False):
            if found not in (wanted, "none"):
                what = "a rate limit's hash" if wanted == "hash" else "a reservation (a string)"
                return ConfigurationError(
                    f"rate limit {self.name!r}: the key {key!r} holds a {found} (a lock, a "
                    f"semaphore, or data of your own), not {what}: give the rate limit a name "
                    "of its own"
                )
        return ConfigurationError(
            f"rate limit {self.name!r}: one of the keys {keys!r} holds another kind of value: "
            "give the rate limit a name of its own"
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

    def __init__(self, redis: Any, name: str, rate: Any, burst: Any = 1) -> None:
        super().__init__(redis, name, rate, burst)
        self._bound = RATE.bind(redis, [self.name], self.plan.args)

    def try_acquire(self) -> Admission:
        """One call now, if every limit admits it: a truthy :class:`Admission`. Refused: a falsy
        one whose ``retry_after`` says when to try again (nothing was consumed)."""
        try:
            with backend_errors(self.redis, self._doing, (self.name,)):
                return Admission.from_reply(self._bound(0, 0, 0))
        except ResponseError:
            return self.admit(0.0)  # (names a key of the wrong type, or raises the error)

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
        early: Any = SAME_AS_MAX_WAIT,
    ) -> Admission:
        """The one round trip under every method: admit a call whose slot is at most ``max_wait``
        seconds away (None: any), without sleeping. With ``reservation`` (a key in the limit's
        cluster slot) a call whose slot is further is deferred instead of refused: its slot is
        kept there for ``keep`` seconds past the slot, and a later call with the same key is
        admitted at that slot (the task layer's ``on_rate_limit="retry"``): at once when the slot
        has passed, and after a wait when it is at most ``early`` seconds away (by default
        ``max_wait``; None: any). Further away, it is deferred again, reservation kept."""
        keys, args = self._call(max_wait, reservation, keep, early)
        try:
            with backend_errors(self.redis, self._doing, keys):
                if reservation is None:  # the hot path: the key and the limits encoded once
                    reply = self._bound(*args[:3])
                else:
                    reply = RATE(self.redis, keys, args)
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            with backend_errors(self.redis, self._doing, keys):
                types = [self.redis.type(key) for key in keys]
            raise self._wrong_type(keys, types) from None
        return Admission.from_reply(reply)

    def reset(self) -> None:
        """Forget every call made so far (the next calls see an idle limit)."""
        with backend_errors(self.redis, f"resetting rate limit {self.name!r}", [self.name]):
            self.redis.delete(self.name)
