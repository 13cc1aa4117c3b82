"""Job functions for ``test_rq_rates.py``: fleet-wide rate limits (``rate=``) in forking
``rq worker`` subprocesses.

Every body records its start as ``<label>|<server time>|<pid>`` on the list
``starts:<job>:<batch>`` (``<label>``: the argument after the batch). The time is the server's
(``TIME``), the clock the rate limit counts on, so starts compare exactly with the slots the limit
handed out. Only ``batch`` is part of a rate key; every call has a lock key of its own.
"""

from __future__ import annotations

import os
from typing import Any

from rq.job import get_current_job

from tasklock.rq import singleton_job


def record(job_name: str, batch: str, label: Any) -> float:
    """Record this body's start (server time, seconds); return it."""
    job = get_current_job()
    assert job is not None, "not running as an RQ job"
    seconds, micros = job.connection.time()
    now = seconds + micros / 1_000_000
    job.connection.rpush(f"starts:{job_name}:{batch}", f"{label}|{now:.6f}|{os.getpid()}")
    return now


@singleton_job(rate="5/s", rate_key=["batch"])
def burst(batch: str, index: int) -> float:
    """Five per second per batch, fleet-wide."""
    return record("burst", batch, index)


@singleton_job()
def free(batch: str, label: str) -> float:
    """No rate limit at all."""
    return record("free", batch, label)


@singleton_job(rate="2/3s", rate_key=["batch"])
def spaced(batch: str, index: int) -> float:
    """One per 1.5 s per batch: with two workers a call is soon further than the 2 s a work horse
    sleeps for its slot, and is rescheduled through RQ's scheduler."""
    return record("spaced", batch, index)


@singleton_job(rate="1/m", rate_key=["batch"])
def per_minute(batch: str, index: int) -> float:
    """One per minute per batch: a second call is deferred (``on_rate_limit="retry"``)."""
    return record("per_minute", batch, index)


@singleton_job(rate="1/m", rate_key=["batch"], on_rate_limit="skip")
def skipped(batch: str, index: int) -> float:
    return record("skipped", batch, index)
