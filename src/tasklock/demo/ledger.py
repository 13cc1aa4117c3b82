"""The demo's "payments": each settle run does fake work, writes through a fenced register and
records itself, so the demo can show what ran and check that no two runs of one account overlapped.

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

# KEYS[1] = register hash, ARGV[1] = item, ARGV[2] = fence token.
# Accept the write only if its token is above every token this item has seen; 1 or 0.
FENCED_WRITE = """
local seen = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if tonumber(ARGV[2]) > seen then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
"""


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
    """Work on ``item`` (an account, a report) for ``seconds``, then write the result through
    the fenced register (unless ``fenced_write`` is False: runs of a ``limit`` > 1 overlap, so
    their tokens do not order their writes), and record the run, with ``extra`` fields. Its
    start is announced too."""
    started = time.time()
    redis_client = client()
    redis_client.rpush(
        f"{namespace()}:starts", json.dumps({"runner": runner, "task": task, "item": item})
    )
    time.sleep(seconds)  # the "payment provider" call
    accepted = True
    if fenced_write:
        register = f"{namespace()}:settled:{runner}:{task}"
        token = str(fence_token or 0)
        accepted = bool(redis_client.eval(FENCED_WRITE, 1, register, str(item), token))
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
