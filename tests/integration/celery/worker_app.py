"""The Celery app that ``celery worker`` subprocesses of the prefork tests run.

Configured from the environment the test gives the worker:

* ``TL_TEST_URL``: the test's redis-server (broker, results, locks);
* ``TL_TEST_LOCK_URL``: a second redis-server, for the locks of ``acks_late_task`` only (the test
  stops it to make Redis unreachable while the broker stays up);
* ``TL_TEST_DIR``: where bodies write their history and the fenced register.

Bodies record each hold (start/end, fence, pid) with :class:`tests.support.history.HistoryLog` and
write through :class:`tests.support.history.FencedRegister`; some publish their pid in Redis so the
test can signal exactly that pool child.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

from tasklock.celery import singleton_task
from tests.support.history import FencedRegister, HistoryLog, Hold

URL = os.environ.get("TL_TEST_URL", "redis://127.0.0.1:1/0")
LOCK_URL = os.environ.get("TL_TEST_LOCK_URL", "redis://127.0.0.1:1/0")
DIRECTORY = Path(os.environ.get("TL_TEST_DIR", "/nonexistent"))

app = Celery("tl_prefork", broker=URL, backend=URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_default_queue="tl_prefork",
    worker_prefetch_multiplier=1,
    result_expires=600,
)


def _redis() -> redis.Redis:
    return redis.Redis.from_url(URL)


def _critical(name: str, account: int, hold: float, fence_token: int | None) -> int | None:
    start = time.monotonic_ns()
    time.sleep(hold)  # the "work" of the critical section
    if fence_token is not None:
        FencedRegister(DIRECTORY / "register.db").write(f"{name}:{account}", fence_token)
    HistoryLog(DIRECTORY / "history.log").record(
        Hold(f"{name}:{account}", fence_token, start, time.monotonic_ns(), os.getpid())
    )
    return fence_token


@singleton_task(app=app, name="p.wait", on_duplicate="wait", wait_timeout=60, fencing=True)
def critical_wait(account: int, hold: float = 0.05, fence_token: int | None = None) -> Any:
    return _critical("p.wait", account, hold, fence_token)


@singleton_task(app=app, name="p.skip", key=["account"], fencing=True)
def critical_skip(
    account: int, call: int = 0, hold: float = 0.2, fence_token: int | None = None
) -> Any:
    return _critical("p.skip", account, hold, fence_token)


@singleton_task(app=app, name="p.paused", ttl=1, fencing=True, key=["account"])
def paused_writer(account: int, role: str, fence_token: int | None = None) -> dict[str, Any]:
    """Announces itself, then waits for the test's go before writing (the test pauses it)."""
    client = _redis()
    client.set(f"pid:{role}", os.getpid())
    while not client.exists(f"go:{role}"):
        time.sleep(0.01)
    assert fence_token is not None
    accepted = FencedRegister(DIRECTORY / "register.db").write(
        f"paused:{account}", fence_token, role
    )
    return {"fence": fence_token, "accepted": accepted}


@singleton_task(app=app, name="p.killed", ttl=1, key=["tag"], dedupe_enqueue=True)
def killed(tag: str, block: bool = True) -> str:
    if block:
        _redis().set(f"pid:{tag}", os.getpid())
        time.sleep(60)  # SIGKILLed by the test long before
    return "ran"


@singleton_task(app=app, name="p.soft", soft_time_limit=1, ttl=30)
def soft_limited(tag: str) -> str:
    try:
        time.sleep(30)
    except SoftTimeLimitExceeded:
        _redis().set(f"soft:{tag}", os.getpid())
        raise
    return "not reached"


@singleton_task(app=app, name="p.hard", time_limit=1, ttl=2, dedupe_enqueue=True)
def hard_limited(tag: str) -> str:
    _redis().set(f"pid:{tag}", os.getpid())
    time.sleep(30)
    return "not reached"


@singleton_task(app=app, name="p.long", ttl=1.5, key=["tag"])
def long_task(tag: str, seconds: float = 0.0) -> float:
    time.sleep(seconds)
    return seconds


@singleton_task(app=app, name="p.acks_late", acks_late=True, url=LOCK_URL)
def acks_late_task(tag: str) -> int:
    return int(_redis().incr(f"ran:{tag}"))


@singleton_task(
    app=app, name="p.redelivered", acks_late=True, reject_on_worker_lost=True, ttl=8,
    on_duplicate="raise",
)  # fmt: skip
def redelivered(tag: str) -> int:
    """The first attempt blocks until the test SIGKILLs it; the redelivered one returns.

    ttl=8: longer than the pool takes to notice the dead child and requeue its message (up to a
    few seconds), so the redelivered attempt really meets its dead attempt's lock."""
    client = _redis()
    attempt = int(client.incr(f"attempt:{tag}"))
    if attempt == 1:
        client.set(f"pid:{tag}", os.getpid())
        time.sleep(60)
    return attempt
