"""celery-singleton's Redis backend, on tasklock's marker scripts. Key and value are the
original's (``<prefix><md5>`` holding the task id), so the original and this module exclude each
other. Two differences: ``lock`` of a key that already holds the same task id succeeds (a retry
is not its own duplicate), and ``unlock(lock, task_id=...)`` removes the key only while it holds
that id (tasklock's release; plain ``unlock(lock)`` removes it unconditionally, as before)."""

from __future__ import annotations

import math
from typing import Any

from redis import Redis

from tasklock.backends import RedisMarkers
from tasklock.compat.celery_singleton.backends.base import BaseBackend
from tasklock.errors import ConfigurationError

__all__ = ["DEFAULT_EXPIRY", "RedisBackend"]

#: Seconds a lock taken with ``expiry=None`` lives (the original's never expired; the task
#: passes its own, see the migration page).
DEFAULT_EXPIRY = 3600


class RedisBackend(BaseBackend):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """``args`` and ``kwargs`` go to ``redis.Redis.from_url`` (responses decoded)."""
        if not args or not isinstance(args[0], str):
            raise ConfigurationError(
                "celery-singleton has no Redis URL: set singleton_backend_url (or a redis:// "
                f"result_backend or broker_url), got {args[0] if args else None!r}"
            )
        try:
            self.redis = Redis.from_url(*args, decode_responses=True, **kwargs)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"singleton_backend_url / singleton_backend_kwargs are not usable: {exc}"
            ) from exc

    def _markers(self) -> RedisMarkers:
        return RedisMarkers(self.redis)

    def lock(self, lock: str, task_id: str, expiry: Any = None) -> bool:
        seconds = DEFAULT_EXPIRY if expiry is None else float(expiry)
        ttl_ms = max(1, math.ceil(seconds * 1000))
        return self._markers().claim(lock, task_id, ttl_ms, "celery-singleton lock") is None

    def renew(self, lock: str, task_id: str, expiry: float) -> str | None:
        """Give ``lock`` a full ``expiry`` from now if it holds ``task_id`` (taking it if it is
        gone); the id it holds otherwise."""
        ttl_ms = max(1, math.ceil(expiry * 1000))
        return self._markers().renew(lock, task_id, ttl_ms, "renewing a celery-singleton lock")

    def unlock(self, lock: str, task_id: str | None = None) -> Any:
        if task_id is None:
            return self.redis.delete(lock)
        return self._markers().delete_if(lock, task_id, "releasing a celery-singleton lock")

    def get(self, lock: str) -> str | None:
        value = self.redis.get(lock)
        return value.decode() if isinstance(value, bytes) else value

    def clear(self, key_prefix: str) -> None:
        for key in list(self.redis.scan_iter(match=key_prefix + "*", count=1000)):
            self.redis.delete(key)
