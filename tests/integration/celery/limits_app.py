"""The Celery app that the ``celery worker --pool=prefork`` subprocess of ``test_limits.py`` runs:
``limit=N`` (N bodies at once per key) and ``dedupe_enqueue="until_start"`` ("one running + one
queued").

Configured from the environment the test gives the worker:

* ``TL_LIMITS_URL``: the test's redis-server (broker, results, locks, and the gates below);
* ``TL_LIMITS_DIR``: where bodies write their history.

A gated body announces its start (``started:<task>:<name>``, a list of fences), then runs until
the test sets ``go:<task>:<name>``; every hold is recorded (start, end, fence, pid) with
:class:`tests.support.history.HistoryLog`. The arguments after ``name`` are no part of the key.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from tasklock.celery import singleton_task
from tests.support.history import HistoryLog, Hold

URL = os.environ.get("TL_LIMITS_URL", "redis://127.0.0.1:1/0")
DIRECTORY = Path(os.environ.get("TL_LIMITS_DIR", "/nonexistent"))
#: ``pending_ttl`` of the coalescing tasks: short, so that a marker nobody renewed would expire
#: while the run ahead of it is still going (the tests hold that run for longer).
SHORT_PENDING_TTL = 1.5

app = Celery("tl_limits", broker=URL, backend=URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_default_queue="tl_limits",
    worker_prefetch_multiplier=1,
    result_expires=600,
)


def _redis() -> redis.Redis:
    return redis.Redis.from_url(URL)


def gated(task: str, name: str, fence_token: int | None) -> int | None:
    """Announce the start, run until the test says go, record the hold."""
    client = _redis()
    start = time.monotonic_ns()
    client.rpush(f"started:{task}:{name}", str(fence_token))
    deadline = time.monotonic() + 60  # the test has long failed by then
    while not client.exists(f"go:{task}:{name}") and time.monotonic() < deadline:
        time.sleep(0.01)
    HistoryLog(DIRECTORY / "history.log").record(
        Hold(f"{task}:{name}", fence_token, start, time.monotonic_ns(), os.getpid())
    )
    client.close()
    return fence_token


# -- "one running + one queued" ------------------------------------------------------------------
@singleton_task(
    app=app, name="l.coalesced_wait", key=["name"], fencing=True, dedupe_enqueue="until_start",
    on_duplicate="wait", wait_timeout=None, pending_ttl=SHORT_PENDING_TTL,
)  # fmt: skip
def coalesced_wait(name: str, fence_token: int | None = None) -> Any:
    """The queued run blocks in a worker slot until the running one releases."""
    return gated("l.coalesced_wait", name, fence_token)


@singleton_task(
    app=app, name="l.coalesced_retry", key=["name"], fencing=True, dedupe_enqueue="until_start",
    on_duplicate="retry", ttl=2, max_retries=0, pending_ttl=SHORT_PENDING_TTL,
)  # fmt: skip
def coalesced_retry(name: str, fence_token: int | None = None) -> Any:
    """The queued run is re-sent until the running one is done: ``max_retries=0`` would fail
    it at its first retry if those retries counted against the limit."""
    return gated("l.coalesced_retry", name, fence_token)


@singleton_task(
    app=app, name="l.retries_itself", bind=True, key=["name"], dedupe_enqueue="until_start",
    on_duplicate="retry",
)  # fmt: skip
def retries_itself(self: Any, name: str) -> int:
    """Its first run asks for a retry a minute later (the test looks at the marker meanwhile)."""
    attempt = int(_redis().incr(f"attempts:{name}"))
    if attempt == 1:
        raise self.retry(countdown=60)
    return attempt


# -- limit=N -------------------------------------------------------------------------------------
@singleton_task(
    app=app, name="l.three_wait", key=["tenant"], limit=3, on_duplicate="wait", wait_timeout=60,
    fencing=True,
)  # fmt: skip
def three_wait(tenant: str, call: int, fence_token: int | None = None) -> Any:
    """Three at a time per tenant; a fourth waits for a permit."""
    return gated("l.three_wait", tenant, fence_token)


@singleton_task(app=app, name="l.two_skip", key=["tenant"], limit=2, fencing=True)
def two_skip(tenant: str, call: int, fence_token: int | None = None) -> Any:
    """Two at a time per tenant; a third is skipped (state DUPLICATE)."""
    return gated("l.two_skip", tenant, fence_token)


@singleton_task(app=app, name="l.rate_only", rate="100/s", rate_key=[], limit=None)
def rate_only(call: int) -> int:
    """No execution lock, only a rate limit: still counted in the fleet's counts."""
    return call
