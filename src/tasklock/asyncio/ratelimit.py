"""``tasklock.asyncio.RateLimit``: :class:`tasklock.RateLimit` on a ``redis.asyncio`` client.

The plan, the script and the meaning of its answer are the blocking class's (one copy, in
:mod:`tasklock.core.rates` and :class:`tasklock.core.ratelimit.RateLimitBase`); only the awaiting
is here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import ResponseError

from tasklock.asyncio.scripts import run_script
from tasklock.core.connection import backend_errors
from tasklock.core.rate_scripts import RATE
from tasklock.core.ratelimit import SAME_AS_MAX_WAIT, RateLimitBase
from tasklock.core.rates import Admission

__all__ = ["RateLimit"]


class RateLimit(RateLimitBase):
    """At most ``rate`` calls per period on ``name``; see :class:`tasklock.RateLimit`.

    ::

        stripe = tasklock.asyncio.RateLimit(aioredis.Redis(), "stripe-api", rate="100/s")
        if await stripe.try_acquire():
            await call_stripe()
        await stripe.acquire(blocking_timeout=5)   # sleeps until its slot; False past the timeout
    """

    async def try_acquire(self) -> Admission:
        """See :meth:`tasklock.RateLimit.try_acquire`."""
        return await self.admit(0.0)

    async def acquire(self, blocking: bool = True, blocking_timeout: float | None = None) -> bool:
        """See :meth:`tasklock.RateLimit.acquire`; a task cancelled in its sleep leaves its slot
        unused."""
        admission = await self.admit(self._check_wait(blocking, blocking_timeout))
        if admission and admission.retry_after > 0:
            await asyncio.sleep(admission.retry_after)
        return admission.allowed

    async def admit(
        self,
        max_wait: float | None,
        *,
        reservation: str | None = None,
        keep: float = 0.0,
        early: Any = SAME_AS_MAX_WAIT,
    ) -> Admission:
        """See :meth:`tasklock.RateLimit.admit`."""
        keys, args = self._call(max_wait, reservation, keep, early)
        try:
            with backend_errors(self.redis, self._doing, keys):
                reply = await run_script(self.redis, RATE, keys, args)
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            with backend_errors(self.redis, self._doing, keys):
                types = [await self.redis.type(key) for key in keys]
            raise self._wrong_type(keys, types) from None
        return Admission.from_reply(reply)

    async def reset(self) -> None:
        """See :meth:`tasklock.RateLimit.reset`."""
        with backend_errors(self.redis, f"resetting rate limit {self.name!r}", [self.name]):
            await self.redis.delete(self.name)
