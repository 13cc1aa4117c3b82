"""celery-singleton's errors. :class:`DuplicateTaskError` pickles (the original's did not: its
``__init__`` takes ``task_id``, which ``args`` lacked, so a worker that stored or retried on it
crashed with ``TypeError: __init__() missing 1 required positional argument``, issue #55)."""

from __future__ import annotations

from typing import Any

__all__ = ["CelerySingletonException", "DuplicateTaskError"]


class CelerySingletonException(Exception):
    pass


class DuplicateTaskError(CelerySingletonException):
    """A duplicate was queued and ``raise_on_duplicate`` is on; ``task_id``: the queued twin's."""

    def __init__(self, message: str, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.task_id))
