"""In-process counters of what the task layer decided, for logs, metrics exporters and tests.

Every duplicate is counted (and logged) so that deduplication is never silent. Read them with
:func:`snapshot`; export them to Prometheus/StatsD from there if you run such a thing.

``import tasklock`` imports this module (``tasklock.stats.snapshot()`` needs nothing else), so it
must stay free of framework imports. Counts here are per process: a forking worker's children
(RQ's work horses, Celery's prefork pool) each count their own. :mod:`tasklock.fleet` adds them up
for the whole fleet in Redis (``tasklock stats``), fed by the sinks registered here.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

__all__ = ["add", "add_sink", "increment", "reset", "snapshot"]

_counts: Counter[str] = Counter()
_lock = threading.Lock()

#: Called with (event, task name, amount) after each count: :mod:`tasklock.fleet`'s batcher.
_sinks: tuple[Callable[[str, str, int], None], ...] = ()


def increment(event: str, task_name: str) -> None:
    """Count one ``event`` (``"duplicate_skip"``, ``"lost"``, ...) in total and for
    ``task_name``."""
    add(event, task_name, 1)


def add(event: str, task_name: str, amount: int) -> None:
    """Add ``amount`` to ``event`` (``"wait_us"``: microseconds waited) in total and for
    ``task_name``."""
    with _lock:
        _counts[event] += amount
        _counts[f"{event}:{task_name}"] += amount
    for sink in _sinks:
        sink(event, task_name, amount)


def add_sink(sink: Callable[[str, str, int], None]) -> None:
    """Have ``sink(event, task_name, amount)`` called after every count (once per sink)."""
    global _sinks
    with _lock:
        if sink not in _sinks:
            _sinks = (*_sinks, sink)


def snapshot() -> dict[str, int]:
    """A copy of the counters, each in total and per task name, e.g.
    ``{"duplicate_skip": 3, "duplicate_skip:app.tasks.settle": 3, "acquired": 9, ...}``.

    Events: ``acquired``; ``ran`` (a body began, with or without a lock); ``waited`` and
    ``wait_us`` (a call that waited for the lock, and for how long); ``duplicate_<policy>``
    (``skip``, ``raise``, ``retry``, and the ``on_wait_timeout`` policy after a ``wait`` timed
    out); ``deduplicated`` (a submission that
    returned its pending twin); ``lost`` (the lock was gone while the task ran, or at its
    release); ``backend_error`` and ``ran_unlocked`` (Redis unreachable, with
    ``on_backend_error`` "raise" and "run").
    """
    with _lock:
        return dict(_counts)


def reset() -> None:
    """Forget every count (tests, or an exporter that reports deltas)."""
    with _lock:
        _counts.clear()
