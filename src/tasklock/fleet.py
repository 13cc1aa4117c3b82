"""Counts for the whole fleet, kept in Redis: what every worker's task layer decided, per task
name, surviving RQ's work horses, Celery's prefork children and hosts.

Why batched, not counted inside the lock scripts: the lock core is framework-free and knows no
task names, and an extra key in every acquire script would tax every lock, task or not. Instead
each process adds its counts up in memory (fed by :mod:`tasklock.stats`'s sink: a dict update
under a lock, no I/O) and a daemon thread writes them every :data:`FLUSH_INTERVAL` seconds in
one pipelined round trip per Redis. The task's own path gains no round trip. Processes that end
without their thread getting a turn flush on the way out: at exit, at the end of the first RQ job
of each process (a work horse runs one job and leaves with ``os._exit``; a SimpleWorker's later
jobs are left to the thread), and on Celery's ``worker_process_shutdown``.
A count that could not be written (Redis unreachable) is kept and written with the next flush.

Layout, per task name (bounded cardinality: never per call key), in the task's cluster slot::

    <prefix>:{<task>}:stats                 hash of totals; expires 7 days after the last count
    <prefix>:{<task>}:stats:<10-min slot>   the same fields for one 10-minute slot; kept 25 hours
    <prefix>:stats:tasks                    sorted set of task names by last count (7 days)

Fields (integers): ``ran``, ``duplicates`` and ``duplicates_<policy>`` (``skip``, ``raise``,
``retry``, and the ``on_wait_timeout`` policy after a ``wait`` timed out), ``waited`` and
``wait_us``, ``retries`` (calls sent again for later: duplicates and rate-limited calls),
``lost``, ``backend_errors``, ``enqueue_dedupes``, ``ran_unlocked`` and ``rate_limited``.

Tasks on etcd keep their counts in process only (:mod:`tasklock.stats`): there is no Redis to
write them to.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tasklock import stats

__all__ = [
    "BUCKET_SECONDS",
    "BUCKET_TTL",
    "FIELDS",
    "FLUSH_INTERVAL",
    "TOTALS_TTL",
    "bind",
    "flush",
    "flush_first_job",
    "forget",
    "merge",
    "read_counts",
    "registry_key",
    "totals_key",
]

log = logging.getLogger("tasklock")

#: Seconds between two writes of one process's counts.
FLUSH_INTERVAL = 1.0
#: The totals of a task expire this long after its last count (a renamed task leaves nothing).
TOTALS_TTL = 7 * 24 * 3600
#: Width of one rolling slot, and how long a slot is kept (the last day, and an hour's margin).
BUCKET_SECONDS = 600
#: How long a slot is kept, in seconds.
BUCKET_TTL = 25 * 3600

#: The fields every task has in ``tasklock stats --json`` (zero when nothing happened).
FIELDS = ("ran", "duplicates", "waited", "retries", "lost", "backend_errors")

#: stats event -> the fleet fields it adds to.
_EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "ran": ("ran",),
    "waited": ("waited",),
    "wait_us": ("wait_us",),
    "lost": ("lost",),
    "backend_error": ("backend_errors",),
    "deduplicated": ("enqueue_dedupes",),
    "ran_unlocked": ("ran_unlocked",),
    "duplicate_skip": ("duplicates", "duplicates_skip"),
    "duplicate_raise": ("duplicates", "duplicates_raise"),
    "duplicate_retry": ("duplicates", "duplicates_retry", "retries"),
    "rate_deferred": ("rate_limited", "retries"),
    "rate_retry": ("rate_limited", "retries"),
    "rate_skip": ("rate_limited",),
    "rate_raise": ("rate_limited",),
    "rate_wait": ("rate_limited",),
}


def totals_key(prefix: str, task: str) -> str:
    """The key of a task's totals, in the task's cluster slot."""
    return f"{prefix}:{{{task}}}:stats"


def bucket_key(prefix: str, task: str, slot: int) -> str:
    return f"{prefix}:{{{task}}}:stats:{slot}"


def registry_key(prefix: str) -> str:
    """The key of the set of task names that have counts."""
    return f"{prefix}:stats:tasks"


def _slot(now: float) -> int:
    return int(now // BUCKET_SECONDS)


# -- the per-process batcher ---------------------------------------------------------------------
class _Batcher:
    """Counts waiting to be written, per task; and where each task's go."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[str, dict[str, int]] = {}
        #: task -> (clients, key prefix): the first that answers takes the counts
        self.targets: dict[str, tuple[tuple[Any, ...], str]] = {}
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()
        self.warned = False
        #: The process whose first job wrote its counts at its end (:func:`flush_first_job`).
        self.first_job_in: int | None = None

    def add(self, event: str, task: str, amount: int) -> None:
        fields = _EVENT_FIELDS.get(event)
        if fields is None:
            return
        with self.lock:
            counts = self.pending.get(task)
            if counts is None:
                counts = self.pending[task] = defaultdict(int)
            for field in fields:
                counts[field] += amount
            if self.thread is None:
                self._start()

    def _start(self) -> None:
        thread = threading.Thread(target=self._run, name="tasklock-fleet-counts", daemon=True)
        self.thread = thread
        thread.start()

    def _run(self) -> None:
        while True:
            self.wake.wait(FLUSH_INTERVAL)
            self.wake.clear()
            self.flush()

    def take(
        self,
    ) -> tuple[dict[str, dict[str, int]], dict[str, tuple[tuple[Any, ...], str]]]:
        with self.lock:
            pending, self.pending = self.pending, {}
            targets = dict(self.targets)
        return pending, targets

    def put_back(self, task: str, counts: Mapping[str, int]) -> None:
        with self.lock:
            mine = self.pending.setdefault(task, defaultdict(int))
            for field, amount in counts.items():
                mine[field] += amount

    def flush(self) -> None:
        pending, targets = self.take()
        if not pending:
            return
        by_target: dict[tuple[int, ...], list[tuple[str, dict[str, int]]]] = defaultdict(list)
        where: dict[tuple[int, ...], tuple[tuple[Any, ...], str]] = {}
        for task, counts in pending.items():
            target = targets.get(task)
            if target is None:
                continue  # a task with no Redis (etcd): its counts stay in tasklock.stats only
            ident = (*(id(client) for client in target[0]), id(target[1]))
            by_target[ident].append((task, counts))
            where[ident] = target
        now = time.time()
        for ident, items in by_target.items():
            clients, prefix = where[ident]
            try:
                _write_first(clients, prefix, items, now)
            except Exception as exc:
                for task, counts in items:
                    self.put_back(task, counts)
                if not self.warned:
                    self.warned = True
                    log.warning(
                        "tasklock: could not write fleet counts (kept, retried every %ss): %s",
                        FLUSH_INTERVAL,
                        exc,
                    )
            else:
                self.warned = False

    def after_fork(self) -> None:
        # The child starts with nothing of its parent's to write, and no thread yet.
        self.lock = threading.Lock()
        self.pending = {}
        self.wake = threading.Event()
        self.thread = None
        self.pid = os.getpid()


def _write_first(
    clients: Sequence[Any], prefix: str, items: list[tuple[str, dict[str, int]]], now: float
) -> None:
    """Write to the first of ``clients`` that takes the counts (Redlock's masters, in order)."""
    for client in clients[:-1]:
        try:
            _write(client, prefix, items, now)
        except Exception:
            continue
        return
    _write(clients[-1], prefix, items, now)


def _write(
    client: Any, prefix: str, items: Iterable[tuple[str, dict[str, int]]], now: float
) -> None:
    slot = _slot(now)
    pipe = client.pipeline(transaction=False)
    registry = registry_key(prefix)
    for task, counts in items:
        totals, bucket = totals_key(prefix, task), bucket_key(prefix, task, slot)
        for field, amount in counts.items():
            pipe.hincrby(totals, field, amount)
            pipe.hincrby(bucket, field, amount)
        pipe.expire(totals, TOTALS_TTL)
        pipe.expire(bucket, BUCKET_TTL)
        pipe.zadd(registry, {task: now})
    pipe.zremrangebyscore(registry, "-inf", now - TOTALS_TTL)
    pipe.expire(registry, TOTALS_TTL)
    pipe.execute()


_batcher = _Batcher()
stats.add_sink(_batcher.add)  # (after a fork the same batcher starts again: after_fork)
os.register_at_fork(after_in_child=lambda: _batcher.after_fork())
atexit.register(lambda: flush())


def bind(task: str, client: Any, prefix: str, *, fallbacks: Sequence[Any] = ()) -> None:
    """Write ``task``'s counts to ``client`` (a Redis client) under ``prefix``, or to the first
    of ``fallbacks`` that answers when it does not (Redlock's other masters). The guard calls it
    on each use with the clients it uses (cheap when nothing changed)."""
    target = _batcher.targets.get(task)
    if target is None or target[0][0] is not client or target[1] != prefix:
        with _batcher.lock:
            _batcher.targets[task] = ((client, *fallbacks), prefix)


def forget() -> None:
    """Drop this process's unwritten counts and where each task's go (tests: a module's servers
    are gone once it ends, and counts bound for them would be retried, and warned about, for
    as long as the process lives)."""
    with _batcher.lock:
        _batcher.pending = {}
        _batcher.targets = {}
        _batcher.warned = False


def flush_first_job() -> None:
    """:func:`flush` at the end of the first job of each process, nothing after it: RQ's work
    horse runs one job and leaves with ``os._exit``, so that is every job there, while a
    SimpleWorker (one process, many jobs) leaves the rest to the thread. (Which process is a
    horse no fork hook can tell: this module may first be imported in the horse.)"""
    if _batcher.first_job_in != os.getpid():
        _batcher.first_job_in = os.getpid()
        flush()


def flush() -> None:
    """Write this process's counts now (a process on its way out; tests)."""
    try:
        _batcher.flush()
    except Exception as exc:  # never fail the caller (atexit, a job's end) over counts
        log.warning("tasklock: could not write fleet counts: %s", exc)


# -- reading -------------------------------------------------------------------------------------
def read_counts(
    client: Any, prefix: str = "tasklock", window: str = "total", now: float | None = None
) -> dict[str, dict[str, int]]:
    """Counts per task name on one Redis: ``window`` ``"total"`` (since the task's counts began,
    kept while it is counted at least once a week), ``"hour"`` or ``"day"`` (the 10-minute slots
    of the last 60 minutes or 24 hours). Every task has at least :data:`FIELDS`."""
    if window not in ("total", "hour", "day"):
        raise ValueError(f"window must be 'total', 'hour' or 'day', got {window!r}")
    now = time.time() if now is None else now
    tasks = sorted(
        name.decode() if isinstance(name, bytes) else str(name)
        for name in client.zrangebyscore(registry_key(prefix), now - TOTALS_TTL, "+inf")
    )
    if not tasks:
        return {}
    pipe = client.pipeline(transaction=False)
    spans: list[int] = []
    for task in tasks:
        keys = _window_keys(prefix, task, window, now)
        spans.append(len(keys))
        for key in keys:
            pipe.hgetall(key)
    answers = pipe.execute()
    result: dict[str, dict[str, int]] = {}
    position = 0
    for task, span in zip(tasks, spans, strict=True):
        counts = dict.fromkeys(FIELDS, 0)
        for answer in answers[position : position + span]:
            for field, value in (answer or {}).items():
                name = field.decode() if isinstance(field, bytes) else str(field)
                counts[name] = counts.get(name, 0) + int(value)
        position += span
        result[task] = counts
    return result


def _window_keys(prefix: str, task: str, window: str, now: float) -> list[str]:
    if window == "total":
        return [totals_key(prefix, task)]
    seconds = 3600 if window == "hour" else 86400
    last = _slot(now)
    first = _slot(now - seconds + BUCKET_SECONDS)
    return [bucket_key(prefix, task, slot) for slot in range(first, last + 1)]


def merge(per_node: Sequence[Mapping[str, Mapping[str, int]]]) -> dict[str, dict[str, int]]:
    """The sum, per task and field, of the counts several nodes answered (Redlock's masters:
    each process writes to the first it reaches)."""
    merged: dict[str, dict[str, int]] = {}
    for counts in per_node:
        for task, fields in counts.items():
            mine = merged.setdefault(task, dict.fromkeys(FIELDS, 0))
            for field, value in fields.items():
                mine[field] = mine.get(field, 0) + value
    return merged
