"""Singleton jobs stacked with RQ's own ``@job`` decorator, in both orders.

RQ's decorator needs its connection when the module is imported, so this module reads the test
server's URL from ``TASKLOCK_RQ_TEST_URL`` (the test sets it, then imports or reloads the module;
worker subprocesses inherit it).
"""

from __future__ import annotations

import os
from typing import Any

import redis
from rq.decorators import job

from tasklock.rq import singleton_job
from tests.integration.rq.jobs import connection, lock_held

QUEUE = "tasklock-stacked"
rq_connection = redis.Redis.from_url(
    os.environ.get("TASKLOCK_RQ_TEST_URL", "redis://127.0.0.1:9/0")
)


@job(QUEUE, connection=rq_connection)
@singleton_job(key=["name"])
def rq_outside(name: str, value: int = 0) -> dict[str, Any]:
    """RQ's @job on top: ``rq_outside.delay(...)`` is RQ's; the worker still takes the lock."""
    connection().rpush("ran:rq_outside", name)
    return {"name": name, "held": lock_held(rq_outside, name, value)}


@singleton_job(key=["name"], dedupe_enqueue=True)
@job(QUEUE, connection=rq_connection)
def rq_inside(name: str, value: int = 0) -> dict[str, Any]:
    """@singleton_job on top: ``.delay(...)`` and ``.enqueue(...)`` also deduplicate."""
    connection().rpush("ran:rq_inside", name)
    return {"name": name, "held": lock_held(rq_inside, name, value)}
