"""The Celery app that the compat tests' ``celery worker --pool=prefork`` subprocess runs: tasks
on :mod:`tasklock.compat.celery_once` and :mod:`tasklock.compat.celery_singleton`, with the
original libraries' settings, on the test's redis-server (``TL_TEST_URL``: broker, results and
the locks). Bodies that the tests need to see running write ``started:<name>`` (and their pid)
to Redis and wait for ``go:<name>`` (or their ``hold``), so tests poll instead of sleeping.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import redis
from celery import Celery

from tasklock.compat.celery_once import QueueOnce
from tasklock.compat.celery_singleton import DuplicateTaskError, Singleton

URL = os.environ.get("TL_TEST_URL", "redis://127.0.0.1:1/0")

app = Celery("tl_compat", broker=URL, backend=URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_default_queue="tl_compat",
    worker_prefetch_multiplier=1,
    result_expires=600,
    ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": URL}},
    singleton_backend_url=URL,
)


def _redis() -> redis.Redis:
    return redis.Redis.from_url(URL)


def _run(name: str, hold: float) -> int:
    """Say that ``name`` runs (with the pid), then run until ``go:<name>`` or ``hold`` s."""
    client = _redis()
    client.set(f"started:{name}", os.getpid(), ex=600)
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline and not client.get(f"go:{name}"):
        time.sleep(0.01)
    return os.getpid()


# -- celery-once ------------------------------------------------------------------------------
@app.task(name="c.once", base=QueueOnce, once={"timeout": 60})
def once_task(name: str, hold: float = 0.0) -> int:
    return _run(name, hold)


@app.task(name="c.once_short", base=QueueOnce, once={"timeout": 2})
def once_short(name: str, hold: float = 0.0) -> int:
    return _run(name, hold)


@app.task(name="c.once_fail", base=QueueOnce)
def once_fail(name: str) -> None:
    raise RuntimeError(f"{name} fails")


@app.task(name="c.once_hard", base=QueueOnce, time_limit=1)
def once_hard(name: str) -> int:
    return _run(name, 30)


@app.task(name="c.once_retry", base=QueueOnce, bind=True, max_retries=3)
def once_retry(self: Any, name: str) -> int:
    if self.request.retries < 2:
        raise self.retry(countdown=0.05)
    return int(self.request.retries)


@app.task(name="c.once_tuple", base=QueueOnce)
def once_tuple(pair: Any, options: Any = None) -> int:
    return len(pair)


@app.task(name="c.once_unlock", base=QueueOnce, once={"unlock_before_run": True})
def once_unlock(name: str, hold: float = 0.0) -> int:
    return _run(name, hold)


# -- celery-singleton -------------------------------------------------------------------------
@app.task(name="c.single", base=Singleton)
def single_task(name: str, hold: float = 0.0) -> int:
    return _run(name, hold)


@app.task(name="c.single_raise", base=Singleton, raise_on_duplicate=True)
def single_raise(name: str, hold: float = 0.0) -> int:
    return _run(name, hold)


@app.task(name="c.single_hard", base=Singleton, time_limit=1)
def single_hard(name: str) -> int:
    return _run(name, 30)


@app.task(name="c.single_retry", base=Singleton, bind=True, max_retries=3)
def single_retry(self: Any, name: str) -> int:
    if self.request.retries < 2:
        raise self.retry(countdown=0.05)
    return int(self.request.retries)


@app.task(name="c.single_uuid", base=Singleton)
def single_uuid(ident: Any, hold: float = 0.0) -> str:
    _run(f"uuid-{ident}", hold)
    return str(ident)


@app.task(
    name="c.single_autoretry",
    base=Singleton,
    autoretry_for=(DuplicateTaskError,),
    max_retries=1,
    default_retry_delay=0.05,
)
def single_autoretry(name: str) -> None:
    """Meets a duplicate of another singleton task, which raises (celery-singleton #55)."""
    single_raise.delay(name, 30)
    single_raise.delay(name, 30)


@app.task(name="c.new_id")
def new_id() -> str:
    return str(uuid.uuid4())
