"""celery-singleton's errors. :class:`DuplicateTaskError` pickles (the original's did not: its
``__init__`` takes ``task_id``, which ``args`` lacked, so a worker that stored or retried on it
crashed with ``TypeError: __init__() missing 1 required positional argument``, issue #55)."""

from __future__ import annotations

__all__ = ["CelerySingletonException", "DuplicateTaskError"]


class CelerySingletonException(Exception):
    pass


class DuplicateTaskError(CelerySingletonException):
    """A duplicate was queued and ``raise_on_duplicate`` is on; ``task_id``: the queued twin's.

    ``args`` holds both arguments, so that pickle and Celery's JSON result backend (which
    rebuilds an exception as ``cls(*args)``) give it back whole; ``str()`` is the message.
    """

    def __init__(self, message: str, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(message, task_id)

    def __str__(self) -> str:
        return str(self.args[0])
