"""celery-singleton, drop-in:
``from tasklock.compat.celery_singleton import Singleton, DuplicateTaskError, clear_locks``.

See ``docs/migrating-from-celery-singleton.md`` for every option and what changed on purpose.
"""

from tasklock.compat.celery_singleton.exceptions import DuplicateTaskError
from tasklock.compat.celery_singleton.singleton import Singleton, clear_locks

__version__ = "0.3.1"

__all__ = ["DuplicateTaskError", "Singleton", "clear_locks"]
