"""What the task and the job report from inside their body: the locks held in TASKLOCK's Redis."""

from __future__ import annotations

from django.conf import settings

from tasklock.core.connection import client_for_url


def held_locks() -> dict[str, int]:
    """The locks held right now in TASKLOCK's Redis, with their TTL left (ms)."""
    locks = client_for_url(settings.TASKLOCK["URL"])
    return {key.decode(): locks.pttl(key) for key in locks.scan_iter(match="shop:*:lock:*")}
