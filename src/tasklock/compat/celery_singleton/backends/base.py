"""The contract of a celery-singleton backend, unchanged: a custom backend subclasses
:class:`BaseBackend` (or just has these methods) and is named by ``singleton_backend_class``; it
is made as ``backend_class(singleton_backend_url, **singleton_backend_kwargs)``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

__all__ = ["BaseBackend"]


class BaseBackend(ABC):
    @abstractmethod
    def lock(self, lock: str, task_id: str, expiry: Any = None) -> bool:
        """Store ``task_id`` under ``lock`` unless it is set; True when stored. ``expiry``:
        seconds until it expires (tasklock always passes one)."""

    @abstractmethod
    def unlock(self, lock: str) -> Any:
        """Remove ``lock``."""

    @abstractmethod
    def get(self, lock: str) -> str | None:
        """The task id stored under ``lock``, or None."""

    @abstractmethod
    def clear(self, key_prefix: str) -> Any:
        """Remove every lock under ``key_prefix``."""
