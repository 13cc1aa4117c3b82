"""tasklock: one-at-a-time Celery tasks and RQ jobs on Redis locks that stay correct when workers
crash, pause or run for hours.

``import tasklock`` imports no framework: the Celery, RQ and Django adapters live in
``tasklock.celery``, ``tasklock.rq`` and ``tasklock.django`` and are imported only when used.
``tasklock.stats`` is imported here (it imports nothing but the standard library), so the counters
the README shows, ``tasklock.stats.snapshot()``, are there after ``import tasklock`` alone.
"""

from tasklock import stats
from tasklock.core.lock import Lock
from tasklock.core.ratelimit import RateLimit
from tasklock.core.redlock import Redlock
from tasklock.core.semaphore import Semaphore
from tasklock.errors import (
    BackendRefused,
    BackendUnavailable,
    ConfigurationError,
    DuplicateJob,
    DuplicateTask,
    DuplicateTaskError,
    KeyEncodingError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    QuorumNotReached,
    RateLimited,
    StaleFence,
    TaskLockError,
)

__version__ = "0.1.0.dev0"

from tasklock.leader import Leader

__all__ = [
    "BackendRefused",
    "BackendUnavailable",
    "ConfigurationError",
    "DuplicateJob",
    "DuplicateTask",
    "DuplicateTaskError",
    "KeyEncodingError",
    "Leader",
    "Lock",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "QuorumNotReached",
    "RateLimit",
    "RateLimited",
    "Redlock",
    "Semaphore",
    "StaleFence",
    "TaskLockError",
    "stats",
]
