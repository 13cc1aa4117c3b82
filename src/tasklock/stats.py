"""In-process counters of what the task layer decided, for logs, metrics exporters and tests.

Every duplicate is counted (and logged) so that deduplication is never silent. Read them with
:func:`snapshot`; export them to Prometheus/StatsD from there if you run such a thing.

``import tasklock`` imports this module (``tasklock.stats.snapshot()`` needs nothing else), so it
must stay free of framework imports. Counts are per process: a forking worker's children (RQ's
work horses, Celery's prefork pool) each count their own.
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["increment", "reset", "snapshot"]

_counts: Counter[str] = Counter()
_lock = threading.Lock()


def increment(event: str, task_name: str) -> None:
    """Count one ``event`` (``"skipped"``, ``"lost"``, ...) in total and for ``task_name``."""
    with _lock:
        _counts[event] += 1
        _counts[f"{event}:{task_name}"] += 1


def snapshot() -> dict[str, int]:
    """A copy of the counters, each in total and per task name, e.g.
    ``{"duplicate_skip": 3, "duplicate_skip:app.tasks.settle": 3, "acquired": 9, ...}``.

    Events: ``acquired``; ``duplicate_<policy>`` (``skip``, ``raise``, ``retry``, and the
    ``on_wait_timeout`` policy after a ``wait`` timed out); ``deduplicated`` (a submission that
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
