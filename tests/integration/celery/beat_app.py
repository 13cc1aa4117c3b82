"""The Celery app that the HA beat tests run as three ``celery beat`` processes and one worker.

Configured from the environment: ``TL_TEST_URL`` (the test's redis-server: broker, results and the
leadership lock) and, in each beat, ``TL_BEAT_RUN`` (the test's run id, so a message left over
from an earlier test is never counted).

The one entry sends ``beat.tick`` every :data:`PERIOD` seconds with one argument that Celery
evaluates in the beat process at send time (a :class:`~celery.beat.BeatLazyFunc`): when it was
sent and by which beat's pid. The worker appends that to ``beat:ticks:<run>`` in Redis, so the
test judges who sent what when, free of the worker's delivery latency.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery
from celery.beat import BeatLazyFunc

URL = os.environ.get("TL_TEST_URL", "redis://127.0.0.1:1/0")
PERIOD = 1.0
TTL = 2


def sender() -> dict[str, Any]:
    """Evaluated by the beat that sends the entry, at send time."""
    return {"at": time.time(), "pid": os.getpid(), "run": os.environ.get("TL_BEAT_RUN", "")}


app = Celery("tl_beat", broker=URL, backend=URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_default_queue="tl_beat",
    result_expires=600,
    tasklock_beat_ttl=TTL,
    beat_max_loop_interval=PERIOD,
    beat_schedule={
        "tick": {"task": "beat.tick", "schedule": PERIOD, "args": (BeatLazyFunc(sender),)}
    },
)


@app.task(name="beat.tick", ignore_result=True)
def tick(sent: dict[str, Any]) -> None:
    redis.Redis.from_url(URL).rpush(f"beat:ticks:{sent['run']}", json.dumps(sent))
