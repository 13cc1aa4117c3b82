"""The Celery apps that the ``celery worker --pool=prefork`` subprocesses of ``test_rates.py`` run:
fleet-wide rate limits (``rate=``) with each ``on_rate_limit`` policy.

Two apps, each with its own queue and its own worker:

* ``app`` (queue ``tl_rates``): the default broker options (one deferral is one hop);
* ``hop_app`` (queue ``tl_rates_hop``): ``visibility_timeout=2`` so that a deferral is split into
  hops of at most 1 s, and kombu sweeps unacknowledged messages back into the queue every second
  (the default sweep, every ~100 s, would hide a redelivery from a test that lasts seconds).

Configured from the environment the test gives the worker: ``TL_RATES_URL``, the test's
redis-server (broker, results, rate limits, locks and the records below).

Every body records its start as ``<label>|<server time>|<pid>`` on the list
``starts:<task>:<batch>`` (``<label>``: the call's argument after the batch). The time is the
server's (``TIME``), the clock the rate limit counts on, so starts compare exactly with the slots
the limit handed out.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import redis
from celery import Celery

from tasklock.celery import singleton_task

URL = os.environ.get("TL_RATES_URL", "redis://127.0.0.1:1/0")

#: A deferral on ``hop_app`` lasts at most half of this (seconds).
HOP_VISIBILITY_TIMEOUT = 2

app = Celery("tl_rates", broker=URL, backend=URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_default_queue="tl_rates",
    worker_prefetch_multiplier=1,
    result_expires=600,
)

hop_app = Celery("tl_rates_hop", broker=URL, backend=URL)
hop_app.conf.update(
    broker_connection_retry_on_startup=True,
    task_default_queue="tl_rates_hop",
    worker_prefetch_multiplier=1,
    result_expires=600,
    broker_transport_options={
        "visibility_timeout": HOP_VISIBILITY_TIMEOUT,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
)


@functools.cache
def _redis(pid: int) -> redis.Redis:
    return redis.Redis.from_url(URL)


def record(task: str, batch: str, label: Any) -> float:
    """Record this body's start (server time, seconds); return it."""
    client = _redis(os.getpid())
    seconds, micros = client.time()
    now = seconds + micros / 1_000_000
    client.rpush(f"starts:{task}:{batch}", f"{label}|{now:.6f}|{os.getpid()}")
    return now


# -- app ------------------------------------------------------------------------------------------
@singleton_task(app=app, name="r.burst", rate="5/s", rate_key=["batch"])
def burst(batch: str, index: int) -> float:
    """Five per second per batch, fleet-wide; each call its own lock key (no duplicates)."""
    return record("r.burst", batch, index)


@singleton_task(app=app, name="r.fast_burst", rate="20/s", rate_key=["batch"])
def fast_burst(batch: str, index: int) -> float:
    """Twenty per second per batch: one slot every 50 ms, less than a worker takes to re-send a
    burst of calls."""
    return record("r.fast_burst", batch, index)


@singleton_task(app=app, name="r.free")
def free(batch: str, label: str) -> float:
    """No rate limit at all."""
    return record("r.free", batch, label)


@singleton_task(
    app=app, name="r.no_retries", bind=True, rate="1/s", rate_key=["batch"], max_retries=0
)
def no_retries(self: Any, batch: str, index: int) -> int:
    """``max_retries=0``: a deferral counted against it would fail the call. Returns the retry
    count the call ran with."""
    record("r.no_retries", batch, index)
    return int(self.request.retries or 0)


@singleton_task(app=app, name="r.skip", rate="1/m", rate_key=["batch"], on_rate_limit="skip")
def skip(batch: str, index: int) -> float:
    return record("r.skip", batch, index)


@singleton_task(app=app, name="r.raise", rate="1/m", rate_key=["batch"], on_rate_limit="raise")
def refuse(batch: str, index: int) -> float:
    return record("r.raise", batch, index)


@singleton_task(app=app, name="r.first_link", rate="1/s", rate_key=["batch"])
def first_link(batch: str, index: int) -> str:
    """The rate-limited first link of a chain; passes the batch on to the next link."""
    record("r.first_link", batch, index)
    return batch


@singleton_task(app=app, name="r.next_link")
def next_link(batch: str, label: str) -> str:
    record("r.next_link", batch, label)
    return f"{batch}:{label}:done"


# -- hop_app --------------------------------------------------------------------------------------
@singleton_task(app=hop_app, name="r.hops", rate="1/4s", rate_key=["batch"])
def hops(batch: str, index: int) -> float:
    """One per four seconds: a deferred call is four seconds away, longer than the broker keeps
    an unacknowledged message (2 s)."""
    return record("r.hops", batch, index)
