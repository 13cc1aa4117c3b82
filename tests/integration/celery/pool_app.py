"""The Celery app that the pool-matrix tests (``test_pools.py``) run under every execution pool.

Configured from the environment the test gives the worker:

* ``TL_POOL_URL``: the broker, the result backend, and what bodies use to talk to the test;
* ``TL_POOL_LOCK_URL``: a second redis-server that holds only the locks, with a ``client_name``
  in the URL, so the test can count exactly the connections tasklock opens there;
* ``TL_POOL_DIR``: where bodies write their history and the fenced register.

Bodies wait with ``time.sleep``, which gevent and eventlet patch into a yield, except
:func:`cpu_bound`, which spins without ever yielding (the case that starves a green watchdog).
Every key a test uses is its own (a random tag), so nothing is flushed between tests.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery

import tasklock
from tasklock.celery import singleton_task
from tasklock.core.connection import client_for_url
from tests.support.history import FencedRegister, HistoryLog, Hold

URL = os.environ.get("TL_POOL_URL", "redis://127.0.0.1:1/0")
LOCK_URL = os.environ.get("TL_POOL_LOCK_URL", "redis://127.0.0.1:1/0")
DIRECTORY = Path(os.environ.get("TL_POOL_DIR", "/nonexistent"))

app = Celery("tl_pools", broker=URL, backend=URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_default_queue="tl_pools",
    worker_prefetch_multiplier=1,
    result_expires=600,
    tasklock_url=LOCK_URL,
)


def locks() -> redis.Redis:
    """The client the task's own lock is on (tasklock's one client per URL): the inner locks of
    :func:`burst` share its pool, so every connection on the lock server is the lock core's."""
    return client_for_url(LOCK_URL)


@singleton_task(app=app, name="pools.burst")
def burst(batch: int, item: int, inner: int = 3) -> int:
    """A distinct singleton call that also takes a few locks of its own inside: with the task's
    acquire and release, more script calls than a thread's warm-up, so on a thread (a greenlet,
    under gevent and eventlet) the lock core would open a connection of its own."""
    for step in range(inner):
        with tasklock.Lock(locks(), f"pools:inner:{batch}:{item}:{step}", timeout=10):
            pass
    return os.getpid()


@singleton_task(
    app=app, name="pools.exclusive", key=["account"], on_duplicate="wait", wait_timeout=60,
    fencing=True,
)  # fmt: skip
def exclusive(account: int, call: int, hold: float = 0.05, fence_token: int | None = None) -> Any:
    """Duplicates wait for each other; each hold is recorded and writes through the register."""
    start = time.monotonic_ns()
    time.sleep(hold)
    assert fence_token is not None
    FencedRegister(DIRECTORY / "register.db").write(f"exclusive:{account}", fence_token)
    HistoryLog(DIRECTORY / "history.log").record(
        Hold(f"exclusive:{account}", fence_token, start, time.monotonic_ns(), os.getpid())
    )
    return fence_token


@singleton_task(app=app, name="pools.sleeper", ttl=1, key=["tag"])
def sleeper(tag: str) -> int:
    """Runs until the test says ``go:<tag>`` (long past its TTL), waiting in a way every pool can
    switch away from. Returns how many times it looked."""
    client = redis.Redis.from_url(URL)
    looks = 1
    deadline = time.monotonic() + 60  # the test has long failed by then
    while not client.exists(f"go:{tag}") and time.monotonic() < deadline:
        time.sleep(0.05)
        looks += 1
    client.close()
    return looks


@singleton_task(app=app, name="pools.cpu_bound", ttl=1, key=["tag"])
def cpu_bound(tag: str, seconds: float, then_sleep: float = 0.0) -> int:
    """Pure computation for longer than its TTL: never yields to a gevent or eventlet hub. Then,
    with ``then_sleep``, a wait (a yield) before it returns."""
    end = time.monotonic() + seconds
    spins = 0
    while time.monotonic() < end:
        spins += 1
    if then_sleep:  # (even sleep(0) is a yield under gevent and eventlet)
        time.sleep(then_sleep)
    return spins
