"""Can the configured Redis user do what tasklock does? Asked by doing it, not by reading ACLs.

ACL rules can be written many ways (command categories, key and channel patterns, selectors in
Redis 7), and the user the doctor connects as is usually not allowed to read them (``ACL GETUSER``
is an admin command). So the doctor runs what a task lock runs, as that user, on a probe key of
its own under the key prefix (``<prefix>:{doctor}:probe:<random>``, deleted again):

* the acquire and release scripts by EVALSHA, loading them first (SCRIPT LOAD) as a lock does:
  without these no lock can be taken, so a refusal is a failure;
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
from tasklock.core.scripts import ACQUIRE, RELEASE
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
    owner = f"doctor-{secrets.token_hex(8)}"
    try:
        acquired, fence = ACQUIRE(client, (key, fence_key_for(key)), (owner, 5000, 5000))
        if acquired:
            value = f"{owner}#{fence}"
            if RELEASE(client, (key,), (value, wake_channel(key))) == PUBLISH_REFUSED:
                found.publish = f"PUBLISH to {wake_channel(key)} refused inside the release script"
    except redis_errors.ResponseError as exc:  # NoPermissionError, or NOPERM inside a script
        found.scripts = str(exc)
    else:
        # If DEL is not allowed, the probe's counter expires within seconds anyway (TTL 5 s).
        with contextlib.suppress(redis_errors.ResponseError):
            client.delete(fence_key_for(key))
    found.subscribe = _subscribe_refused(client, wake_channel(key))
    return found


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
