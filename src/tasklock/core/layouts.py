"""What a single-instance lock or semaphore runs on its server, decided once for both drivers.

A :class:`Layout` names the scripts, keys and fixed arguments of acquire, release, extend and
(with fair waiting) leaving the queue. :class:`tasklock.Lock` and :class:`tasklock.Semaphore`,
sync and asyncio, differ only in the layout they build: a plain key or a sorted set of permits,
each with or without the FIFO queue (``fair``). The drivers send what the layout says and do
nothing else differently.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

from tasklock.core.keys import fence_counter_ttl_ms, queue_keys_for, wake_channel, wake_id
from tasklock.core.owner import token_id
from tasklock.core.queue_scripts import (
    FAIR_ACQUIRE,
    FAIR_PERMIT_ACQUIRE,
    FAIR_PERMIT_RELEASE,
    FAIR_RELEASE,
    LEAVE_QUEUE,
)
from tasklock.core.scripting import Script
from tasklock.core.scripts import (
    ACQUIRE,
    EXTEND,
    PERMIT_ACQUIRE,
    PERMIT_EXTEND,
    PERMIT_RELEASE,
    RELEASE,
)

__all__ = ["WAITER_LIVENESS", "Layout", "lock_layout", "permit_layout"]

#: How long a queued waiter stays in the queue without renewing (seconds). A waiter renews with
#: every attempt, at most a second apart (MAX_POLL_INTERVAL), so only one that died, hung or lost
#: its connection drops out; and it holds the queue up for no longer than this.
WAITER_LIVENESS = 3.0

#: Layouts kept for reuse per kind: enough for the names a program locks again and again, and
#: small for the same reason as :data:`tasklock.core.lanes.ENCODED_LIMIT` (a task's per-call names
#: are never looked up twice, and thousands of kept layouts cost the garbage collector more than
#: building one).
LAYOUT_CACHE_SIZE = 256


class Layout(NamedTuple):
    """The server side of one lock object (see the module docstring). A named tuple, not a
    frozen dataclass: a lock made per call builds one, and a frozen dataclass's ``__init__``
    cost as much as everything else in :func:`lock_layout`."""

    acquire: Script
    acquire_keys: tuple[str, ...]
    #: The acquire's arguments after the per-call ones (the owner token, and with ``fair`` the
    #: "this attempt waits" flag).
    acquire_tail: tuple[Any, ...]
    release: Script
    release_keys: tuple[str, ...]
    release_tail: tuple[Any, ...]
    extend: Script
    #: With fair waiting: the script, keys and trailing arguments that take an owner token out
    #: of the queue (after a waiter gave up); None without.
    leave: tuple[Script, tuple[str, ...], tuple[Any, ...]] | None = None

    @property
    def fair(self) -> bool:
        return self.leave is not None

    def attempt_args(self, owner: str, waiting: bool) -> tuple[str, ...]:
        """The acquire's per-call arguments: the owner token, and (fair) whether it waits and
        how it stands in the queue (:meth:`member`)."""
        if self.leave is None:
            return (owner,)
        return (owner, "1" if waiting else "0", self.member(owner))

    @staticmethod
    def member(owner: str) -> str:
        """How a waiter of this process with ``owner`` stands in a queue: this process's wake id
        (read per call: a forked child has its own) and the token's random part, which stays
        the same when a retry restamps the token's time."""
        return f"{wake_id()} {token_id(owner)}"


@lru_cache(maxsize=LAYOUT_CACHE_SIZE)
def lock_layout(name: str, fence_key: str, ttl: float, fair: bool) -> Layout:
    """A Lock: one key holding ``<owner>#<fence>``. (Layouts are immutable: the same arguments
    share one, so a lock object made per use builds nothing new.)"""
    ttl_ms = max(1, int(ttl * 1000))
    channel = wake_channel(name)
    if not fair:
        return Layout(
            ACQUIRE,
            (name, fence_key),
            (ttl_ms, fence_counter_ttl_ms(ttl)),
            RELEASE,
            (name,),
            (channel,),
            EXTEND,
        )
    queue, waiters = queue_keys_for(name)
    return Layout(
        FAIR_ACQUIRE,
        (name, fence_key, queue, waiters),
        (ttl_ms, fence_counter_ttl_ms(ttl), int(WAITER_LIVENESS * 1000)),
        FAIR_RELEASE,
        (name, queue, waiters),
        (channel,),
        EXTEND,
        (LEAVE_QUEUE, (name, queue, waiters), (channel, 1)),
    )


@lru_cache(maxsize=LAYOUT_CACHE_SIZE)
def permit_layout(name: str, fence_key: str, ttl: float, limit: int, fair: bool) -> Layout:
    """A Semaphore: a sorted set of ``limit`` permits (see PERMIT_ACQUIRE)."""
    ttl_ms = max(1, int(ttl * 1000))
    channel = wake_channel(name)
    if not fair:
        return Layout(
            PERMIT_ACQUIRE,
            (name, fence_key),
            (ttl_ms, fence_counter_ttl_ms(ttl), limit),
            PERMIT_RELEASE,
            (name,),
            (channel,),
            PERMIT_EXTEND,
        )
    queue, waiters = queue_keys_for(name)
    return Layout(
        FAIR_PERMIT_ACQUIRE,
        (name, fence_key, queue, waiters),
        (ttl_ms, fence_counter_ttl_ms(ttl), limit, int(WAITER_LIVENESS * 1000)),
        FAIR_PERMIT_RELEASE,
        (name, queue, waiters),
        (channel, limit),
        PERMIT_EXTEND,
        (LEAVE_QUEUE, (name, queue, waiters), (channel, limit)),
    )
