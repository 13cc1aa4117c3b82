"""Job functions for ``test_rq_limits.py``: ``limit=N`` and ``dedupe_enqueue="until_start"``
("one running + one queued") in forking ``rq worker`` subprocesses and in the in-process worker.

A gated body announces its start (``started:<job>:<name>``, a list of fences), then runs until the
test sets ``go:<job>:<name>``, and records its hold (start, end, fence, pid) in the history file it
is given. Only the first argument (``name``, ``tenant``) is part of the key.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rq.job import get_current_job

from tasklock.rq import singleton_job
from tests.support.history import HistoryLog, Hold


def gated(job_name: str, name: str, history: str, fence_token: int | None) -> int | None:
    job = get_current_job()
    assert job is not None, "not running as an RQ job"
    conn = job.connection
    start = time.monotonic_ns()
    conn.rpush(f"started:{job_name}:{name}", str(fence_token))
    deadline = time.monotonic() + 60  # the test has long failed by then
    while not conn.exists(f"go:{job_name}:{name}") and time.monotonic() < deadline:
        time.sleep(0.01)
    HistoryLog(history).record(
        Hold(f"{job_name}:{name}", fence_token, start, time.monotonic_ns(), os.getpid())
    )
    return fence_token


@singleton_job(key=["tenant"], limit=2, on_duplicate="wait", wait_timeout=60, fencing=True)
def two_wait(tenant: str, call: int, history: str, fence_token: int | None = None) -> Any:
    """Two at a time per tenant; a third waits in its work horse for a permit."""
    return gated("two_wait", tenant, history, fence_token)


@singleton_job(key=["tenant"], limit=2, fencing=True)
def two_skip(tenant: str, call: int, history: str, fence_token: int | None = None) -> Any:
    """Two at a time per tenant; a third finishes without running (``job.meta["tasklock"]``)."""
    return gated("two_skip", tenant, history, fence_token)


@singleton_job(
    key=["name"], fencing=True, dedupe_enqueue="until_start", on_duplicate="retry", ttl=2
)
def coalesced(name: str, history: str, fence_token: int | None = None) -> Any:
    """The queued run is rescheduled (RQ's scheduler) until the running one is done."""
    return gated("coalesced", name, history, fence_token)


@singleton_job(key=["name"], dedupe_enqueue="until_start", on_duplicate="retry")
def fails_once(name: str) -> int:
    """Its first run fails; enqueued with ``retry=Retry(...)``, RQ runs it again later."""
    job = get_current_job()
    assert job is not None
    attempt = int(job.connection.incr(f"attempts:fails_once:{name}"))
    if attempt == 1:
        raise RuntimeError("the first run fails on purpose")
    return attempt
