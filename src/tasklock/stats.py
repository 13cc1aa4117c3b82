"""In-process counters of what the task layer decided, for logs, metrics exporters and tests.

Every duplicate is counted (and logged) so that deduplication is never silent. Read them with
:func:`snapshot`; export them to Prometheus/StatsD from there if you run such a thing.
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["increment", "reset", "snapshot"]

_counts: Counter[str] = Counter()
_lock = threading.Lock()


def increment(event: str, task_name: str) -> None:
    with _lock:
        _counts[event] += 1
        _counts[f"{event}:{task_name}"] += 1


def snapshot() -> dict[str, int]:
    """A copy of the counters: ``{"skipped": 3, "skipped:app.tasks.settle": 3, ...}``."""
    with _lock:
        return dict(_counts)


def reset() -> None:
    with _lock:
        _counts.clear()
