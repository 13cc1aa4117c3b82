"""celery-once's Redis backend (``celery_once.backends.Redis``), on tasklock's marker scripts.

The key is the original's (``qo_...``) and its TTL the timeout. The value is the task id of the
call that queued it (the original stored a redis-py Lock token), and a worker clears it only if
it names its own task, or if it is a token the original wrote (32 hex digits, no owner to
check): during a rolling deploy a new worker clears what an old producer queued, and an old
worker clears (unconditionally, as before) what a new producer queued.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any
from urllib.parse import parse_qsl, urlparse

from redis import StrictRedis

from tasklock.backends import RedisMarkers
from tasklock.compat.celery_once.tasks import AlreadyQueued
from tasklock.core.connection import backend_errors
from tasklock.core.scripting import Script
from tasklock.errors import ConfigurationError

__all__ = ["RELEASE", "Redis", "get_redis", "parse_url"]

#: Delete the marker if it names this task, or if it is a token of the original's (redis-py
#: Lock: ``uuid1().hex``), which records no owner. Returns 1 when deleted.
RELEASE = Script(
    "once_release",
    """
local v = redis.call('GET', KEYS[1])
if v and (v == ARGV[1] or (string.len(v) == 32 and string.match(v, '^%x+$'))) then
  return redis.call('DEL', KEYS[1])
end
return 0
""",
)

#: How often a blocking ``raise_or_lock`` looks again (redis-py Lock's default ``sleep``).
_POLL = 0.1


def parse_url(url: str) -> dict[str, Any]:
    """Connection keywords for ``redis://host:port[/db][?options]``, ``rediss://...`` and
    ``redis+socket:///path[?options]``; ValueError (a ConfigurationError) for anything else."""
    parsed = urlparse(url)
    details: dict[str, Any]
    if parsed.scheme in ("redis", "rediss"):
        details = {"host": parsed.hostname}
        if parsed.port:
            details["port"] = parsed.port
        if parsed.password:
            details["password"] = parsed.password
        db = parsed.path.lstrip("/")
        if db and db.isdigit():
            details["db"] = db
        if parsed.scheme == "rediss":
            details["ssl"] = True
    elif parsed.scheme == "redis+socket":
        details = {"unix_socket_path": parsed.path}
    else:
        raise ConfigurationError(
            f"Unsupported protocol {parsed.scheme} in ONCE['settings']['url']: use redis://, "
            "rediss:// or redis+socket://"
        )
    details.update(parse_qsl(parsed.query))
    if "socket_timeout" in details:
        details["socket_timeout"] = float(details["socket_timeout"])
    if "db" in details:
        details["db"] = int(details["db"])
    return details


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def get_redis(settings: Any) -> Any:
    """One client per URL in a process (the original kept one for the first URL it saw, for
    every app)."""
    url = settings.get("url") if hasattr(settings, "get") else None
    if not isinstance(url, str) or not url:
        raise ConfigurationError(
            "ONCE['settings']['url'] must be the Redis URL of celery-once's locks, e.g. "
            f"'redis://localhost:6379/0', got {url!r}"
        )
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = StrictRedis(**parse_url(url))
        return client


class Redis:
    """The Redis backend: the original's protocol (``raise_or_lock``, ``clear_lock``) and the
    marker store tasklock's QueueOnce uses (``claim``, ``renew``, ``delete_if``, ``countdown``).
    Settings: ``url``, ``blocking`` (wait for a queued twin to finish, default False) and
    ``blocking_timeout`` (for how long, default 1 s)."""

    def __init__(self, settings: Any) -> None:
        self._redis = get_redis(settings)
        self.blocking_timeout = settings.get("blocking_timeout", 1)
        self.blocking = settings.get("blocking", False)

    @property
    def redis(self) -> Any:
        return self._redis

    # -- the original's protocol -----------------------------------------------------------------
    def raise_or_lock(self, key: str, timeout: float) -> None:
        """Mark ``key`` as queued for ``timeout`` seconds, or raise AlreadyQueued."""
        if self.claim(key, uuid.uuid1().hex, int(timeout * 1000), "celery-once lock") is not None:
            raise AlreadyQueued(self.countdown(key))

    def clear_lock(self, key: str) -> Any:
        return self.redis.delete(key)

    # -- tasklock's marker store -----------------------------------------------------------------
    def claim(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        deadline = time.monotonic() + float(self.blocking_timeout or 0)
        while True:
            existing = RedisMarkers(self.redis).claim(key, task_id, ttl_ms, what)
            if existing is None or not self.blocking or time.monotonic() >= deadline:
                return existing
            time.sleep(min(_POLL, max(0.0, deadline - time.monotonic())))

    def renew(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        return RedisMarkers(self.redis).renew(key, task_id, ttl_ms, what)

    def delete_if(self, key: str, task_id: str, what: str) -> bool:
        with backend_errors(self.redis, what):
            return bool(RELEASE(self.redis, (key,), (task_id,)))

    def countdown(self, key: str) -> float:
        """Seconds until ``key`` expires (the original's ``AlreadyQueued.countdown``)."""
        return float(self.redis.pttl(key)) / 1000.0
