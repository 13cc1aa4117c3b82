"""celery-once, drop-in: ``from tasklock.compat.celery_once import QueueOnce, AlreadyQueued``.

See ``docs/migrating-from-celery-once.md`` for every option and what changed on purpose.
"""

from tasklock.compat.celery_once.tasks import AlreadyQueued, QueueOnce

__version__ = "3.0.1"

__all__ = ["AlreadyQueued", "QueueOnce"]
