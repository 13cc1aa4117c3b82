"""A waiter blocked on a held lock, and proof that the release woke it (not its fallback poll)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis

from tasklock.core.keys import wake_channel

__all__ = [
    "BIG_SLEEP",
    "WAKE_DEADLINE",
    "assert_woken_by_release",
    "evalsha_calls",
    "subscribers",
]

#: A waiter's ``sleep``: its first fallback poll would come 15-30 s after it went to sleep.
BIG_SLEEP = 30.0
#: Far below BIG_SLEEP: a waiter holding the lock by then was woken by the release.
WAKE_DEADLINE = 10.0


def assert_woken_by_release(
    waiter: Any, release: Callable[[], object], asleep: Callable[[], object]
) -> None:
    """Block ``waiter.acquire`` in a thread (give the waiter ``sleep=BIG_SLEEP``); once
    ``asleep()`` (a poll-with-deadline that the waiter subscribed and went to sleep) has
    returned, call ``release()``; the waiter must hold the lock within WAKE_DEADLINE."""
    acquired = threading.Event()
    outcome: list[bool] = []

    def wait() -> None:
        outcome.append(waiter.acquire(blocking_timeout=25))
        acquired.set()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    asleep()
    release()
    assert acquired.wait(WAKE_DEADLINE), "not woken by the release"
    thread.join(5)
    assert outcome == [True]


def evalsha_calls(r: redis.Redis) -> int:
    """EVALSHA calls the server has run: each lock attempt is one, so a waiter that tried twice
    has subscribed and is in its wait (not still about to make its first attempt)."""
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def subscribers(r: redis.Redis, name: str) -> int:
    """Clients subscribed to ``name``'s wake channel on this server."""
    channel = wake_channel(name)
    return int(dict(r.pubsub_numsub(channel)).get(channel.encode(), 0))
