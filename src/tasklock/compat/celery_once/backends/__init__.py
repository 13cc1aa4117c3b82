"""celery-once's backends, served by tasklock: ``Redis`` and ``File``. The original's paths
(``celery_once.backends.Redis``, ``celery_once.backends.File``) in ``app.conf.ONCE`` name these."""

from tasklock.compat.celery_once.backends.file import File
from tasklock.compat.celery_once.backends.redis import Redis

__all__ = ["File", "Redis"]
