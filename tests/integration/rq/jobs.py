"""Job functions for the RQ tests.

They live in an importable module because RQ enqueues a function by its dotted path and the
worker (in-process or a `rq worker` subprocess) imports it again. Jobs talk to the test through
their own Redis connection (``get_current_job().connection``): lists they push to are the events
the tests wait on.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from rq import Queue
from rq.job import Job, get_current_job

from tasklock.rq import singleton_job
from tests.support.history import FencedRegister, HistoryLog, Hold


def current() -> Job:
    job = get_current_job()
    assert job is not None, "not running as an RQ job"
    return job


def connection() -> redis.Redis:
    return current().connection


def lock_held(func: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether the lock key of this call exists, computed the way a producer computes it."""
    return bool(connection().exists(func.tasklock.guard.lock_key(args, kwargs)))


class Opaque:
    """Pickles fine (so RQ can enqueue it), but cannot be part of a lock key."""


# -- the everyday job ------------------------------------------------------------------------
@singleton_job(ttl=30, key=["account_id"], fencing=True)
def settle(account_id: int, day: str, fence_token: int | None = None) -> dict[str, Any]:
    connection().rpush("ran:settle", f"{account_id}:{day}")
    return {
        "account_id": account_id,
        "day": day,
        "fence": fence_token,
        "held": lock_held(settle, account_id, day),
    }


@singleton_job
def bare(name: str) -> str:
    connection().rpush("ran:bare", name)
    return name


@singleton_job(limit=None, rate="100/s", rate_key=[])
def rate_only(name: str) -> str:
    """No execution lock, only a rate limit: still counted in the fleet's counts."""
    return name


@singleton_job()
def tally(items: list[int], mode: str = "sum") -> int:
    return sum(items) if mode == "sum" else len(items)


# -- one job per on_duplicate policy ----------------------------------------------------------
@singleton_job(on_duplicate="raise")
def strict(name: str) -> str:
    connection().rpush("ran:strict", name)
    return name


@singleton_job(on_duplicate="retry", ttl=2, dedupe_enqueue=True)
def patient(name: str) -> str:
    connection().rpush("ran:patient", name)
    return name


@singleton_job(on_duplicate="wait", wait_timeout=20)
def waiter(name: str) -> dict[str, Any]:
    return {"name": name, "held": lock_held(waiter, name)}


@singleton_job(on_duplicate="wait", wait_timeout=0.3)
def impatient(name: str) -> str:
    connection().rpush("ran:impatient", name)
    return name


# -- dedupe_enqueue ----------------------------------------------------------------------------
@singleton_job(dedupe_enqueue=True)
def deduped(name: str, fail: bool = False) -> str:
    connection().rpush("ran:deduped", name)
    if fail:
        raise RuntimeError(f"deduped({name!r}) failed on purpose")
    return name


@singleton_job(dedupe_enqueue=True)
def flaky(name: str) -> str:
    """Fails on its first attempt, succeeds on the second (for RQ's own Retry)."""
    if connection().incr(f"attempts:flaky:{name}") == 1:
        raise RuntimeError("first attempt fails")
    return name


@singleton_job(dedupe_enqueue=True)
def enqueues_twin(name: str) -> dict[str, str]:
    """Enqueues its own twin while it runs: deduplication must hand back this very job."""
    job = current()
    twin = enqueues_twin.enqueue(Queue(job.origin, connection=job.connection), name)
    return {"self": job.id, "twin": twin.id}


# -- Redis unreachable -------------------------------------------------------------------------
@singleton_job(on_backend_error="run")
def fail_open(name: str) -> str:
    connection().rpush("ran:fail_open", name)
    return name


@singleton_job(on_backend_error="run", dedupe_enqueue=True)
def fail_open_deduped(name: str) -> str:
    return name


# -- worker subprocess scenarios ---------------------------------------------------------------
@singleton_job(key=["name"], on_duplicate="wait", wait_timeout=60, fencing=True)
def critical(
    name: str, hold: float, history: str, register: str, fence_token: int | None = None
) -> bool:
    """A critical section: a fenced write, some work, and the hold recorded in the history."""
    assert fence_token is not None
    start = time.monotonic_ns()
    accepted = FencedRegister(register).write(name, fence_token, payload=str(os.getpid()))
    time.sleep(hold)  # the work whose overlap the checker looks for
    HistoryLog(history).record(Hold(name, fence_token, start, time.monotonic_ns(), os.getpid()))
    return accepted


@singleton_job(ttl=60, key=["name"])
def sleepy(name: str, seconds: float) -> None:
    """Outlives its RQ job_timeout; the lock must still be released (in finally)."""
    conn = connection()
    conn.rpush(f"started:{name}", int(lock_held(sleepy, name, seconds)))
    time.sleep(seconds)


@singleton_job(ttl=2, key=["name"])
def hang(name: str) -> None:
    """Reports its (work horse) pid, then hangs until it is killed."""
    conn = connection()
    conn.rpush(f"pids:{name}", os.getpid())
    conn.blpop([f"never:{name}"], timeout=60)


@singleton_job(ttl=1, key=["name"], fencing=True)
def long_hold(name: str, fence_token: int | None = None) -> dict[str, Any]:
    """Runs for three TTLs checking that its lock is still its own, then waits for the test."""
    conn = connection()
    key = long_hold.tasklock.guard.lock_key((name,), {})
    mine = f"#{fence_token}".encode()
    conn.rpush(f"started:{name}", fence_token or 0)
    checks = misses = 0
    deadline = time.monotonic() + 3 * long_hold.tasklock.guard.options.ttl
    while time.monotonic() < deadline:
        value = conn.get(key)
        checks += 1
        misses += value is None or not value.endswith(mine)
        time.sleep(0.05)
    conn.rpush(f"past:{name}", checks)
    conn.blpop([f"go:{name}"], timeout=30)
    return {"checks": checks, "misses": misses, "fence": fence_token}


# -- workflows: depends_on a job that meets its twin --------------------------------------------
def record_event(kind: str, name: str) -> None:
    """Append ``kind`` to ``events:<name>`` with the Redis server's clock (one clock for every
    process), so a test reads what ran in which order from the list and its timestamps."""
    conn = connection()
    seconds, micros = conn.time()
    event = {"event": kind, "job": current().id, "at": seconds * 1_000_000 + micros}
    conn.rpush(f"events:{name}", json.dumps(event))


def _rebuild_body(name: str, gate: str | None, fail: bool) -> str:
    record_event("rebuild-start", name)
    if gate is not None and connection().blpop([gate], timeout=30) is None:
        raise RuntimeError(f"rebuild({name!r}): the test never opened {gate}")
    record_event("rebuild-end", name)
    if fail:
        raise RuntimeError(f"rebuild({name!r}) failed on purpose")
    return name


@singleton_job(key=["name"])
def rebuild(name: str, gate: str | None = None, fail: bool = False) -> str:
    """The slow work ("rebuild the report"); with a ``gate`` it runs until the test pushes to it."""
    return _rebuild_body(name, gate, fail)


@singleton_job(key=["name"], on_duplicate="raise")
def rebuild_strict(name: str, gate: str | None = None, fail: bool = False) -> str:
    return _rebuild_body(name, gate, fail)


@singleton_job(key=["name"], dedupe_enqueue=True)
def rebuild_deduped(name: str, gate: str | None = None, fail: bool = False) -> str:
    return _rebuild_body(name, gate, fail)


def email_report(name: str) -> str:
    """A plain RQ job that must come after the rebuild ("email the report")."""
    record_event("email", name)
    return name


# -- a decorated function bound to another name -----------------------------------------------
def plain_add(a: int, b: int) -> int:
    return a + b


misbound = singleton_job(plain_add)
