"""celery-singleton's settings (``singleton_*`` in ``app.conf``), read as the original reads them.

Two differences, both chosen to fix a reported bug without changing a key that worked:

* ``singleton_json_encoder_class`` unset encodes UUIDs, datetimes, dates, times and Decimals as
  the text Celery's JSON serializer gives them, so ``task.delay(uuid)`` works (issues #36/#42,
  the original raised TypeError) and keys the same as ``task.delay(str(uuid))``. Set it to
  ``None`` for the original's plain ``json.dumps``, or to your own encoder (a class or its path).
* the original's backend path ``celery_singleton.backends.redis.RedisBackend`` (the default) is
  tasklock's :class:`~tasklock.compat.celery_singleton.backends.redis.RedisBackend`.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from importlib import import_module
from typing import Any

from tasklock.errors import ConfigurationError

__all__ = ["BACKEND_ALIASES", "Config", "TaskArgumentEncoder"]

_REDIS_BACKEND = "tasklock.compat.celery_singleton.backends.redis.RedisBackend"
BACKEND_ALIASES = {
    "celery_singleton.backends.redis.RedisBackend": _REDIS_BACKEND,
    "celery_singleton.backends.RedisBackend": _REDIS_BACKEND,
}
_UNSET = object()


class TaskArgumentEncoder(json.JSONEncoder):
    """Arguments JSON cannot carry, as the text a worker gets for them from Celery's JSON."""

    def default(self, o: Any) -> Any:
        if isinstance(o, uuid.UUID | decimal.Decimal):
            return str(o)
        if isinstance(o, dt.datetime | dt.date | dt.time):
            return o.isoformat()
        return super().default(o)


def _import(path_or_class: Any, setting: str) -> Any:
    if not isinstance(path_or_class, str):
        return path_or_class
    path = BACKEND_ALIASES.get(path_or_class, path_or_class)
    module_name, _, class_name = path.rpartition(".")
    try:
        return getattr(import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(
            f"{setting} = {path_or_class!r} cannot be imported ({exc}): give a class or the "
            "dotted path of one"
        ) from exc


class Config:
    """The ``singleton_*`` settings of ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    @property
    def key_prefix(self) -> str:
        return self.app.conf.get("singleton_key_prefix", "SINGLETONLOCK_")  # type: ignore[no-any-return]

    @property
    def backend_class(self) -> Any:
        value = self.app.conf.get(
            "singleton_backend_class", "celery_singleton.backends.redis.RedisBackend"
        )
        return _import(value, "singleton_backend_class")

    @property
    def json_encoder_class(self) -> Any:
        value = self.app.conf.get("singleton_json_encoder_class", _UNSET)
        if value is _UNSET:
            return TaskArgumentEncoder
        return _import(value, "singleton_json_encoder_class")

    @property
    def backend_kwargs(self) -> dict[str, Any]:
        return self.app.conf.get("singleton_backend_kwargs", {})  # type: ignore[no-any-return]

    @property
    def backend_url(self) -> str | None:
        url = self.app.conf.get("singleton_backend_url")
        if url is not None:
            return url  # type: ignore[no-any-return]
        url = self.app.conf.get("result_backend")
        if not url or not isinstance(url, str) or not url.startswith(("redis://", "rediss://")):
            url = self.app.conf.get("broker_url")
        return url  # type: ignore[no-any-return]

    @property
    def raise_on_duplicate(self) -> bool | None:
        return self.app.conf.get("singleton_raise_on_duplicate")  # type: ignore[no-any-return]

    @property
    def lock_expiry(self) -> float | None:
        return self.app.conf.get("singleton_lock_expiry")  # type: ignore[no-any-return]
