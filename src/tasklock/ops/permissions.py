"""Can the configured Redis user do what tasklock does? Asked by doing it, not by reading ACLs.

ACL rules can be written many ways (command categories, key and channel patterns, selectors in
Redis 7), and the user the doctor connects as is usually not allowed to read them (``ACL GETUSER``
is an admin command). So the doctor runs what a task lock runs, as that user, on a probe key of
its own under the key prefix (``<prefix>:{doctor}:probe:<random>``, deleted again):

* the acquire and release scripts by EVALSHA, loading them first (SCRIPT LOAD) as a lock does:
  without these no lock can be taken, so a refusal is a failure; the same for a rate limit's
  script, through every branch (admitted, deferred with a reservation, admitted on it);
* PUBLISH on the probe's wake channel (``tasklock:wake:<key>``) from inside the release script:
  without it locks still work and waiters fall back to polling, so a refusal is a warning;
* SUBSCRIBE to that channel, as a waiter does: the same.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from typing import Any

import redis.exceptions as redis_errors

from tasklock.core.keys import fence_key_for, wake_channel
from tasklock.core.layouts import Layout, lock_layout, permit_layout
from tasklock.core.rate_scripts import RATE
from tasklock.core.rates import RatePlan
from tasklock.core.wakeup import PUBLISH_REFUSED

__all__ = ["Permissions", "probe_permissions"]

#: How long the doctor waits for the server to confirm (or refuse) its SUBSCRIBE.
SUBSCRIBE_WAIT = 2.0


@dataclass
class Permissions:
    """What the probe was refused: None where it was allowed, else the server's answer."""

    scripts: str | None = None
    publish: str | None = None
    subscribe: str | None = None


def probe_permissions(client: Any, key_prefix: str = "tasklock") -> Permissions:
    """Take and release a probe lock and subscribe to its wake channel, as ``client``'s user.

    Connection errors propagate (the caller reports the server unreachable); refusals are
    recorded in the answer.
    """
    found = Permissions()
    key = f"{key_prefix}:{{doctor}}:probe:{secrets.token_hex(4)}"
    try:
        # A lock taken, a second owner queued behind it and leaving, the release; then a
        # semaphore's permit: every command the lock and permit scripts call runs once.
        for layout in (
            lock_layout(key, fence_key_for(key), PROBE_TTL, fair=True),
            permit_layout(key, fence_key_for(key), PROBE_TTL, 2, fair=True),
        ):
            if _probe(client, layout) == PUBLISH_REFUSED:
                found.publish = f"PUBLISH to {wake_channel(key)} refused inside the release script"
        _probe_rate(client, f"{key}:rate")
    except redis_errors.ResponseError as exc:  # NoPermissionError, or NOPERM inside a script
        found.scripts = str(exc)
    else:
        # If DEL is not allowed, these expire within seconds anyway (TTL 5 s).
        with contextlib.suppress(redis_errors.ResponseError):
            client.delete(fence_key_for(key), f"{key}:rate")
    found.subscribe = _subscribe_refused(client, wake_channel(key))
    return found


#: The probe's TTL (seconds): whatever a refused step leaves behind expires by itself.
PROBE_TTL = 5.0


def _probe(client: Any, layout: Layout) -> Any:
    """Take with ``layout``; have a second owner try as a waiter (a Lock queues it, a semaphore
    of two gives it the second permit) and leave or release; release. The last answer."""
    owner, other = f"doctor-{secrets.token_hex(8)}", f"doctor-{secrets.token_hex(8)}"
    acquired, fence = layout.acquire(
        client, layout.acquire_keys, (*layout.attempt_args(owner, False), *layout.acquire_tail)
    )
    if not acquired:
        return None
    if layout.leave is not None:
        took, other_fence = layout.acquire(
            client, layout.acquire_keys, (*layout.attempt_args(other, True), *layout.acquire_tail)
        )
        if took:
            value = f"{other}#{other_fence}".encode()
            layout.release(client, layout.release_keys, (value, *layout.release_tail))
        else:
            script, keys, tail = layout.leave
            script(client, keys, (layout.member(other), *tail))
    value = f"{owner}#{fence}".encode()
    return layout.release(client, layout.release_keys, (value, *layout.release_tail))


def _probe_rate(client: Any, key: str) -> None:
    """A rate limit's three kinds of call: admitted, deferred (its slot reserved), and admitted on
    its reservation."""
    keys = (key, f"{key}:slot")
    args = (0, round(PROBE_TTL * 1000), -1, *RatePlan.of("1/h").args)
    for _ in range(3):
        RATE(client, keys, args)


def _subscribe_refused(client: Any, channel: str) -> str | None:
    pubsub = client.pubsub()
    try:
        pubsub.subscribe(channel)
        message = pubsub.get_message(timeout=SUBSCRIBE_WAIT)
        if message is None or message.get("type") != "subscribe":
            return f"SUBSCRIBE to {channel} was not confirmed within {SUBSCRIBE_WAIT:g} s"
        return None
    except redis_errors.ResponseError as exc:
        return str(exc)
    finally:
        pubsub.close()
