"""The demo's "payments": each settle run does fake work, writes its result with
:func:`tasklock.fencing.redis.fenced_set` (refused, as StaleFence, when a newer hold has written
that item) and records itself, so the demo can show what ran and check that no two runs of one
account overlapped.

Configured by the environment the demo gives its workers: ``TASKLOCK_URL`` (the Redis the demo
uses) and ``TASKLOCK_KEY_PREFIX`` (one namespace per demo run, so a demo against a shared Redis
touches only its own keys). tasklock itself reads the same two variables.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis

from tasklock.core.connection import client_for_url
from tasklock.errors import StaleFence
from tasklock.fencing.redis import fenced_set

__all__ = [
    "EXPORT_SECONDS",
    "NOTIFY_PER_SECOND",
    "NOTIFY_SECONDS",
    "REBUILD_SECONDS",
    "REFRESH_SECONDS",
    "SETTLE_SECONDS",
    "client",
    "namespace",
    "read_runs",
    "read_starts",
    "work",
]

#: Long enough that the burst's duplicates reach a free worker while the first run still works.
SETTLE_SECONDS = 2.0
REBUILD_SECONDS = 0.5
#: The fourth scene: exports run two at a time; a refresh runs while submissions arrive.
EXPORT_SECONDS = 0.8
REFRESH_SECONDS = 0.8
#: The fifth scene: a notification does next to no work; only when it starts matters.
NOTIFY_SECONDS = 0.01
#: ... and its tasks' rate: ``rate="5/s"`` per tenant.
NOTIFY_PER_SECOND = 5


def namespace() -> str:
    return os.environ.get("TASKLOCK_KEY_PREFIX", "tasklock-demo")


def client() -> redis.Redis:
    return client_for_url(os.environ.get("TASKLOCK_URL", "redis://127.0.0.1:6379/0"))


def work(
    runner: str,
    task: str,
    item: int,
    fence_token: int | None,
    seconds: float,
    *,
    fenced_write: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Work on ``item`` (an account, a report) for ``seconds``, then write the result fenced by
    ``fence_token`` (unless ``fenced_write`` is False: runs of a ``limit`` > 1 overlap, so their
    tokens do not order their writes), and record the run, with ``extra`` fields; a refused write
    is recorded as ``"accepted": False``. Its start is announced too."""
    started = time.time()
    redis_client = client()
    redis_client.rpush(
        f"{namespace()}:starts", json.dumps({"runner": runner, "task": task, "item": item})
    )
    time.sleep(seconds)  # the "payment provider" call
    accepted = True
    if fenced_write:
        # One key per item; the check and the write are one script. The hash tag keeps its fence
        # key under the namespace too ("<key>:fence", not "{<key>}:fence"): --url deletes by it.
        key = f"{namespace()}:settled:{{{runner}:{task}:{item}}}"
        result = json.dumps({"pid": os.getpid(), "fence": fence_token, "at": time.time()})
        try:
            fenced_set(redis_client, key, result, fence_token)
        except StaleFence:
            accepted = False  # a newer hold wrote this item: the run's late write changed nothing
    record = {
        "runner": runner,
        "task": task,
        "item": item,
        "fence": fence_token,
        "accepted": accepted,
        "pid": os.getpid(),
        "start": started,
        "end": time.time(),
        **(extra or {}),
    }
    redis_client.rpush(f"{namespace()}:runs", json.dumps(record))
    return record


def read_runs(redis_client: redis.Redis, prefix: str) -> list[dict[str, Any]]:
    """Every recorded run, in the order they finished."""
    return [json.loads(raw) for raw in redis_client.lrange(f"{prefix}:runs", 0, -1)]


def read_starts(redis_client: redis.Redis, prefix: str) -> list[dict[str, Any]]:
    """Every run that began, in the order they began (a run still going is here, not in runs)."""
    return [json.loads(raw) for raw in redis_client.lrange(f"{prefix}:starts", 0, -1)]
