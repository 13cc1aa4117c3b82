"""``tasklock.Semaphore``: at most ``limit`` holders at once, each with a permit of its own.

A Lock is the one-permit case of the same lease: this class is :class:`tasklock.Lock` with the
permit scripts mixed in (:class:`tasklock.core.permits.PermitRules`), so acquiring is still one
round trip (take a free permit and its fence, or learn when the first permit frees), releasing
is one (drop ours and wake the waiters), and waiting, the watchdog, fencing, ``lost`` and the
errors are the lock's own code. Only the reads that look at the permits are here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tasklock.core.base import BaseLock, Number
from tasklock.core.lock import Lock
from tasklock.core.owner import Holder
from tasklock.core.permits import PermitRules, check_limit

__all__ = ["Semaphore"]


class Semaphore(PermitRules, Lock):
    """A Redis semaphore: at most ``limit`` holders of ``name`` at once, fleet-wide.

    The same surface as :class:`tasklock.Lock` (``acquire(blocking, blocking_timeout)``,
    ``release``, ``extend``, ``reacquire``, ``owned``, ``with``, ``fence``, ``lost``/``on_lost``,
    ``watchdog``, ``owner_info``), and the same parameters after ``limit``. Each permit has its
    own owner and TTL (30 s renewed by the watchdog with ``timeout=None``), so a crashed
    holder's permit comes back within its TTL; a release wakes the waiters. ``fence`` is strictly
    increasing per name across all permits. ``locked()`` is True when no permit is free (as
    :meth:`asyncio.Semaphore.locked`); :meth:`holders` lists who holds the permits.

    ``limit`` may differ between calls (a deployment lowers it): holders above the new limit keep
    their permit until they release it, and nobody new gets in until fewer than ``limit`` hold.
    One object holds one permit per thread (a second ``acquire`` in the same thread raises, as
    for a Lock); threads sharing one object each take their own.

    The permits live in one sorted set at ``name`` (its fence counter is the lock's,
    ``{name}:fence``: both in one Redis Cluster slot). A plain :class:`tasklock.Lock` holding the
    same name counts as holding every permit, and a Lock sees the permits as held, so code that
    moves a name between the two stays exclusive. There is no Redlock semaphore: with each
    holder counted on a majority only, a quorum of per-master counts admits more than ``limit``
    holders at once (up to 1.5 x with 3 masters, nearly 2 x with many).
    """

    def __init__(
        self,
        redis: Any,
        name: str,
        limit: int,
        timeout: Number | None = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Number | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        fence_key: str | None = None,
        watchdog: bool | None = None,
        on_lost: Callable[[BaseLock], Any] | None = None,
        owner_info: Mapping[str, Any] | None = None,
        fair: bool = True,
    ) -> None:
        self.limit = check_limit(limit)
        super().__init__(
            redis,
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            raise_on_release_error,
            fence_key=fence_key,
            watchdog=watchdog,
            on_lost=on_lost,
            owner_info=owner_info,
            fair=fair,
        )

    def locked(self) -> bool:
        """True when all ``limit`` permits are held (an acquire now would wait)."""
        return self._state().full(self.limit)

    def holders(self) -> list[tuple[Holder, float | None]]:
        """Who holds the permits now, and for how many more seconds each (first to free first)."""
        return self._state().holders()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} limit={self.limit} ttl={self.ttl} "
            f"fence={self.fence}>"
        )
