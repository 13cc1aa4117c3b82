"""Every error tasklock raises, under one root.

Catch :class:`TaskLockError` to catch them all. Lock errors also subclass redis-py's own lock
errors, so code written against ``redis.lock.Lock`` keeps working when handed a
:class:`tasklock.Lock`; :class:`BackendUnavailable` subclasses redis-py's ``ConnectionError`` for
the same reason, and :class:`ConfigurationError` / :class:`KeyEncodingError` subclass
``ValueError`` / ``TypeError`` so generic handlers still see what kind of mistake it was::

    TaskLockError
    ├── ConfigurationError        (ValueError)  a bad option, named
    │   └── BackendRefused        (redis.RedisError)  Redis refused the credentials, an ACL
    │                             permission or the database: which, and how to fix it
    ├── KeyEncodingError          (TypeError)   a task argument that cannot be part of a key
    ├── BackendUnavailable        (redis.ConnectionError)  Redis did not answer: URL + what to check
    │   └── QuorumNotReached      Redlock: too few masters answered; which ones and why
    ├── LockError                 (redis.exceptions.LockError)
    │   └── LockNotOwnedError     (redis.exceptions.LockNotOwnedError)
    │       └── LockLostError     the watchdog found the lock gone while it was held
    └── DuplicateTaskError        another call with the same key is running
        ├── DuplicateTask         Celery (picklable, survives the result backend)
        └── DuplicateJob          RQ
"""

from __future__ import annotations

from typing import Any

import redis.exceptions as redis_errors

__all__ = [
    "BackendRefused",
    "BackendUnavailable",
    "ConfigurationError",
    "DuplicateJob",
    "DuplicateTask",
    "DuplicateTaskError",
    "KeyEncodingError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "QuorumNotReached",
    "RateLimited",
    "StaleFence",
    "TaskLockError",
]


class TaskLockError(Exception):
    """Root of every error raised by tasklock."""


class ConfigurationError(TaskLockError, ValueError):
    """An option or setting is wrong. The message names the option and the accepted values."""


class BackendRefused(ConfigurationError, redis_errors.RedisError):
    """Redis refused tasklock's settings: a wrong password, an ACL user without a command or key
    tasklock needs (NOPERM), a database the server does not have.

    A setting to fix, not an outage, so not :class:`BackendUnavailable`: retrying would loop until
    someone fixes it, and ``on_backend_error="run"`` must not run every task unlocked because of
    a typo. Also a redis-py ``RedisError``, so handlers written for redis-py still see it. The
    message names the server and the fix; the redis-py error is chained as ``__cause__``.
    """

    def __init__(self, message: str) -> None:
        redis_errors.RedisError.__init__(self, message)

    __repr__ = Exception.__repr__  # RedisError's shows only the class, hiding the message


class KeyEncodingError(TaskLockError, TypeError):
    """A task argument cannot be encoded into a lock key (the message names it and its type)."""


class BackendUnavailable(TaskLockError, redis_errors.ConnectionError):
    """Redis could not be reached or did not answer in time.

    The message names the server and what to check; the redis-py error is chained as
    ``__cause__``.
    """

    __repr__ = Exception.__repr__  # redis-py's ConnectionError shows only the class in %r logs


class QuorumNotReached(BackendUnavailable):
    """Redlock could not reach a majority of masters; ``failures`` maps each node to its error."""

    def __init__(self, message: str, failures: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.failures = dict(failures or {})


class LockError(TaskLockError, redis_errors.LockError):
    """A lock operation was used wrongly (released twice, not held, cannot be acquired)."""

    def __init__(self, message: str | None = None, lock_name: str | None = None) -> None:
        super().__init__(message, lock_name=lock_name)


class LockNotOwnedError(LockError, redis_errors.LockNotOwnedError):
    """The lock is no longer held by this owner (it expired, or someone else holds it)."""


class LockLostError(LockNotOwnedError):
    """The watchdog found the lock gone, or could not renew it before its TTL ran out."""


class DuplicateTaskError(TaskLockError):
    """A call with the same lock key is already running.

    ``key`` is the lock key and ``holder`` a readable description of who holds it. Arguments are
    kept in ``args`` in constructor order so the error pickles and survives result backends.
    """

    def __init__(self, message: str, key: str | None = None, holder: str | None = None) -> None:
        super().__init__(message, key, holder)
        self.message = message
        self.key = key
        self.holder = holder

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.key, self.holder))


class DuplicateTask(DuplicateTaskError):
    """Celery: raised by a singleton task with ``on_duplicate="raise"``."""


class DuplicateJob(DuplicateTaskError):
    """RQ: raised by a singleton job with ``on_duplicate="raise"``."""


class RateLimited(TaskLockError):
    """A rate-limited task call that may not run now (``on_rate_limit="raise"``, or ``"wait"``
    past ``wait_timeout`` with ``on_wait_timeout="raise"``).

    ``key`` is the rate limit's key and ``retry_after`` the seconds until a call would pass. It
    pickles with both, so it survives result backends.
    """

    def __init__(self, message: str, key: str | None = None, retry_after: float = 0.0) -> None:
        super().__init__(message, key, retry_after)
        self.message = message
        self.key = key
        self.retry_after = retry_after

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.key, self.retry_after))


class StaleFence(TaskLockError):
    """A write fenced with a token older than one the resource has already seen: the writer's
    hold was lost (it paused or ran past its TTL) and a later holder has written since.

    ``resource`` names what was written, ``token`` is the refused token and ``newer`` the token
    the resource holds (None when it could not be read). The caller's transaction must roll back
    with everything it wrote; the fencing helpers raise this inside it so that it does. Pickles
    with its fields, so it survives result backends.
    """

    def __init__(self, resource: str, token: int, newer: int | None = None) -> None:
        super().__init__(resource, token, newer)
        self.resource = resource
        self.token = token
        self.newer = newer

    def __str__(self) -> str:
        seen = f"token {self.newer} is newer" if self.newer is not None else "a newer token is"
        return (
            f"stale fence for {self.resource!r}: token {self.token} was refused, {seen} already "
            "written there (this holder's lock was lost: it paused or ran past its TTL, and a "
            "later holder has written since); roll back"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.resource, self.token, self.newer))
