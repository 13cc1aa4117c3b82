"""Names derived from a lock name: its fence counter and its wake-up channel.

The fence counter must live in the same Redis Cluster slot as the lock, because the acquire script
touches both. Redis hashes only the part between the first ``{`` and the next ``}`` when that part
is non-empty (the hash tag), so:

* a name that has a hash tag keeps it: ``jobs:{acct-42}:lock`` -> ``jobs:{acct-42}:lock:fence``;
* a name without one is wrapped so its whole text becomes the tag: ``report`` -> ``{report}:fence``.

A name with a stray ``}`` and no valid tag (``a}b``) cannot be wrapped: on Redis Cluster its lock
and default fence key land in different slots, so give such a lock an explicit ``fence_key=`` with
the same hash tag as the name. On a single Redis (or Redlock masters) this does not matter.
"""

from __future__ import annotations

import os
import secrets

__all__ = [
    "FENCE_COUNTER_TTL",
    "fence_counter_ttl_ms",
    "fence_key_for",
    "hash_tag",
    "queue_keys_for",
    "wake_channel",
    "wake_id",
]

WAKE_PREFIX = "tasklock:wake:"

#: Seconds a fence counter lives after the last acquisition of its lock (or locks).
#:
#: Fences stay strictly increasing without the counter: a fence is the server's clock in
#: microseconds, or one more than the counter's last token where that is higher, so it is above
#: every token issued before even when the counter expired, was evicted, or was lost in a restart
#: or failover. So the counter can expire, and idle lock names (one per invoice, say) leave no key
#: behind for longer than this. What the counter still does: while it lives, a server clock
#: stepped back (or two holds in one microsecond) cannot make a token repeat.
FENCE_COUNTER_TTL = 3600.0


def hash_tag(name: str) -> str | None:
    """The hash tag Redis Cluster would use for ``name``, or None if the whole name is hashed."""
    start = name.find("{")
    if start < 0:
        return None
    end = name.find("}", start + 1)
    if end <= start + 1:
        return None
    return name[start + 1 : end]


def _beside(name: str, suffix: str) -> str:
    """``name`` + ``suffix`` in ``name``'s cluster slot."""
    if hash_tag(name) is not None or "}" in name:
        # A tagged name keeps its tag. A name with a stray "}" and no tag cannot be wrapped
        # (the tag would end at that brace); it is only a concern on Redis Cluster.
        return f"{name}:{suffix}"
    return f"{{{name}}}:{suffix}"


def fence_key_for(name: str) -> str:
    """The default fence counter key of lock ``name`` (same cluster slot as ``name``)."""
    return _beside(name, "fence")


def queue_keys_for(name: str) -> tuple[str, str]:
    """The fair-waiting queue of ``name`` (see :mod:`tasklock.core.queue_scripts`): its list of
    waiters and its sorted set of their liveness deadlines, in ``name``'s cluster slot (as
    :func:`_beside` puts them, written out: a lock made per call asks for them)."""
    if hash_tag(name) is not None or "}" in name:
        return f"{name}:queue", f"{name}:waiters"
    return f"{{{name}}}:queue", f"{{{name}}}:waiters"


def fence_counter_ttl_ms(lock_ttl: float) -> int:
    """The fence counter's TTL in ms for a lock of ``lock_ttl`` seconds: FENCE_COUNTER_TTL, or
    the lock's own TTL when that is longer (a counter outliving the hold it fenced)."""
    return max(1, int(max(FENCE_COUNTER_TTL, lock_ttl) * 1000))


def wake_channel(name: str) -> str:
    """The pub/sub channel on which a release of ``name`` wakes waiters."""
    return WAKE_PREFIX + name


_wake_id = secrets.token_hex(4)


def wake_id() -> str:
    """This process's wake id: eight hex digits, new in every process (and after a fork). A fair
    waiter queues as ``<wake id> <token id>``, so a release knows which process to wake."""
    return _wake_id


def _new_wake_id() -> None:
    global _wake_id
    _wake_id = secrets.token_hex(4)


os.register_at_fork(after_in_child=_new_wake_id)
