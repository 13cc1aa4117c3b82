"""celery-singleton's backends and :func:`get_backend`, which makes the configured one once per
(class, URL, keyword arguments) in a process (the original kept the first one it made, whatever
app or settings asked later)."""

from __future__ import annotations

import threading
from typing import Any

from tasklock.compat.celery_singleton.backends.base import BaseBackend
from tasklock.compat.celery_singleton.backends.redis import RedisBackend

__all__ = ["BaseBackend", "RedisBackend", "get_backend"]

_backends: dict[tuple[Any, Any, str], Any] = {}
_backends_lock = threading.Lock()


def get_backend(config: Any) -> Any:
    """The backend ``config`` names: ``backend_class(backend_url, **backend_kwargs)``."""
    klass, url, kwargs = config.backend_class, config.backend_url, config.backend_kwargs
    key = (klass, url, repr(sorted((kwargs or {}).items())))
    with _backends_lock:
        backend = _backends.get(key)
        if backend is None:
            backend = _backends[key] = klass(url, **(kwargs or {}))
        return backend
