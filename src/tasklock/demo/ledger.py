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

__all__ = ["REBUILD_SECONDS", "SETTLE_SECONDS", "client", "namespace", "read_runs", "work"]

#: Long enough that the burst's duplicates reach a free worker while the first run still works.
SETTLE_SECONDS = 2.0
REBUILD_SECONDS = 0.5

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
    runner: str, task: str, item: int, fence_token: int | None, seconds: float
) -> dict[str, Any]:
    """Work on ``item`` (an account, a report) for ``seconds``, then write the result through
    the fenced register, and record the run."""
    started = time.time()
    time.sleep(seconds)  # the "payment provider" call
    redis_client = client()
    register = f"{namespace()}:settled:{runner}:{task}"
    accepted = bool(redis_client.eval(FENCED_WRITE, 1, register, str(item), str(fence_token or 0)))
    record = {
        "runner": runner,
        "task": task,
        "item": item,
        "fence": fence_token,
        "accepted": accepted,
        "pid": os.getpid(),
        "start": started,
        "end": time.time(),
    }
    redis_client.rpush(f"{namespace()}:runs", json.dumps(record))
    return record


def read_runs(redis_client: redis.Redis, prefix: str) -> list[dict[str, Any]]:
    """Every recorded run, in the order they finished."""
    return [json.loads(raw) for raw in redis_client.lrange(f"{prefix}:runs", 0, -1)]
