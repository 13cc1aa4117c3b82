"""A Celery task with no tasklock options of its own: URL, TTL, KEY_PREFIX and ON_DUPLICATE all
come from ``settings.TASKLOCK``."""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings

from tasklock.celery import singleton_task
from tests.django_project.shop.locks import held_locks


@singleton_task
def settle(account_id: int) -> dict[str, Any]:
    held = held_locks()
    # Its own client: BLPOP waits longer than redis-py's default 5 s socket timeout allows.
    with redis.Redis.from_url(settings.TASKLOCK["URL"], socket_timeout=90) as signals:
        signals.rpush("shop:settle:started", account_id)
        # Hold the lock until the test says so: a twin sent meanwhile meets it.
        if signals.blpop([f"shop:settle:finish:{account_id}"], timeout=60) is None:
            raise TimeoutError("the test never let settle finish")
    return {"account_id": account_id, "locks": held}
