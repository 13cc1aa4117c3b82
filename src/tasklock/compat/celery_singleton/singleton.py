"""``Singleton`` and ``clear_locks``: celery-singleton's task base, on tasklock.

The original's observable behaviour is kept: a ``delay()``/``apply_async()`` of a call whose twin
is queued or running sends nothing and returns the twin's ``AsyncResult`` (or raises
:class:`DuplicateTaskError` with ``raise_on_duplicate``); ``unique_on``, ``lock_expiry`` and the
``singleton_*`` settings; the key ``<prefix><md5>`` holding the task id, in the same Redis.

On tasklock's rules (a :class:`tasklock.celery.SingletonTask` enqueue marker, see
:mod:`tasklock.compat.base`): every lock has a TTL; only its task clears it; it is cleared on
success, final failure, revoke (#29), a hard time limit (#40), a killed pool child and a failed
publish; a retry is never returned as its own duplicate (#10/#20); a lock naming a task that the
result backend reports finished is replaced.
"""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, Any, ClassVar

from celery import Task

from tasklock.celery.task import _call_target
from tasklock.compat.base import CompatGuard, CompatTask
from tasklock.compat.celery_singleton import util
from tasklock.compat.celery_singleton.backends import get_backend
from tasklock.compat.celery_singleton.config import Config
from tasklock.compat.celery_singleton.exceptions import DuplicateTaskError
from tasklock.errors import ConfigurationError, LockError

if TYPE_CHECKING:
    from celery.result import AsyncResult

__all__ = ["Singleton", "clear_locks"]

#: Tries to lock or read a key that keeps changing hands under us.
_ATTEMPTS = 5


def clear_locks(app: Any) -> None:
    """Remove every lock under the app's ``singleton_key_prefix`` (e.g. at worker start)."""
    config = Config(app)
    get_backend(config).clear(config.key_prefix)


def _unique_on(value: Any, name: str) -> list[str] | None:
    if value is None:
        return None
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ConfigurationError(
            f"unique_on of {name} must be an argument name or a list of them, got {value!r}"
        )
    return list(names)


class _BackendMarkers:
    """A celery-singleton backend (``lock``, ``get``, ``unlock``) as tasklock's marker store."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def claim(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        expiry = math.ceil(ttl_ms / 1000)
        for _ in range(_ATTEMPTS):
            if self.backend.lock(key, task_id, expiry=expiry):
                return None
            existing = self.backend.get(key)
            if existing == task_id:
                return None
            if existing is not None:
                return str(existing)
        raise LockError(f"{what}: {key} kept changing hands in {_ATTEMPTS} attempts")

    def renew(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        renew = getattr(self.backend, "renew", None)
        return None if renew is None else renew(key, task_id, ttl_ms / 1000)

    def delete_if(self, key: str, task_id: str, what: str) -> bool:
        if "task_id" in inspect.signature(self.backend.unlock).parameters:
            return bool(self.backend.unlock(key, task_id=task_id))
        if self.backend.get(key) != task_id:  # a custom backend: look, then remove
            return False
        self.backend.unlock(key)
        return True


class Singleton(CompatTask):
    """A task that is queued at most once per key until it finishes (celery-singleton's base).

    ``@app.task(base=Singleton, unique_on=["user_id"], raise_on_duplicate=False, lock_expiry=600)``
    """

    abstract = True
    _tasklock_own_attributes = frozenset(
        {"unique_on", "raise_on_duplicate", "lock_expiry", "on_duplicate"}
    )
    _singleton_backend: Any = None
    _singleton_config: Config | None = None
    unique_on: ClassVar[Any] = None
    raise_on_duplicate: ClassVar[bool | None] = None
    lock_expiry: ClassVar[float | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.name or f"{cls.__module__}.{cls.__qualname__}"
        names = _unique_on(cls.unique_on, name)
        expiry = cls.lock_expiry
        if expiry is not None and (
            isinstance(expiry, bool) or not isinstance(expiry, int | float) or expiry <= 0
        ):
            raise ConfigurationError(
                f"lock_expiry of {name} must be seconds above 0, or None, got {expiry!r}"
            )
        run = inspect.getattr_static(cls, "run", None)
        if names and run is not None and run is not inspect.getattr_static(Task, "run"):
            params = inspect.signature(_call_target(run, name)).parameters
            missing = [n for n in names if n not in params]
            if missing:
                raise ConfigurationError(
                    f"unique_on of {name} names {', '.join(map(repr, missing))}, but it takes "
                    f"({', '.join(params) or 'no arguments'})"
                )

    # -- the original's configuration properties ------------------------------------------------
    @property
    def _raise_on_duplicate(self) -> bool:
        if self.raise_on_duplicate is not None:
            return self.raise_on_duplicate
        return self.singleton_config.raise_on_duplicate or False

    @property
    def singleton_config(self) -> Config:
        if self._singleton_config is None:
            self._singleton_config = Config(self._compat_app())
        return self._singleton_config

    @property
    def singleton_backend(self) -> Any:
        return get_backend(self.singleton_config)

    def _expiry(self) -> float | None:
        if self.lock_expiry is not None:
            return self.lock_expiry
        return self.singleton_config.lock_expiry

    # -- the original's methods ------------------------------------------------------------------
    def aquire_lock(self, lock: str, task_id: str) -> bool:
        expiry = self._expiry()
        if expiry is None:
            expiry = self.tasklock_guard.options.pending_ttl
        return bool(self.singleton_backend.lock(lock, task_id, expiry=expiry))

    def get_existing_task_id(self, lock: str) -> str | None:
        return self.singleton_backend.get(lock)  # type: ignore[no-any-return]

    def generate_lock(self, task_name: str, task_args: Any = None, task_kwargs: Any = None) -> str:
        """The key: every argument as passed, or only ``unique_on`` (defaults applied; ``[]``:
        the task name alone)."""
        unique_on = _unique_on(self.unique_on, self.name)
        task_args = list(task_args or [])
        task_kwargs = dict(task_kwargs or {})
        if unique_on is not None:
            if not any(unique_on):
                unique_kwargs: dict[str, Any] = {}
            else:
                run = getattr(self, "_orig_run", self.run)
                try:
                    bound = inspect.signature(run).bind(*task_args, **task_kwargs)
                except TypeError as exc:
                    raise TypeError(f"arguments do not match task {self.name}: {exc}") from None
                bound.apply_defaults()
                unique_kwargs = {key: bound.arguments[key] for key in unique_on}
            unique_args: list[Any] = []
        else:
            unique_args, unique_kwargs = task_args, task_kwargs
        config = self.singleton_config
        try:
            return util.generate_lock(
                task_name,
                unique_args,
                unique_kwargs,
                key_prefix=config.key_prefix,
                json_encoder_class=config.json_encoder_class,
            )
        except TypeError as exc:
            raise TypeError(
                f"{exc}: task {self.name}'s arguments must be JSON-encodable to make its lock "
                "key; set singleton_json_encoder_class, or leave it unset for tasklock's encoder "
                "(UUID, datetime, Decimal)"
            ) from None

    def release_lock(self, task_args: Any = None, task_kwargs: Any = None) -> None:
        """Remove this call's lock, whoever holds it (as the original)."""
        self.unlock(self.generate_lock(self.name, task_args, task_kwargs))

    def unlock(self, lock: str) -> None:
        self.singleton_backend.unlock(lock)

    def on_duplicate(self, existing_task_id: str) -> AsyncResult[Any]:
        """The twin's result, or DuplicateTaskError with ``raise_on_duplicate``."""
        if self._raise_on_duplicate:
            raise DuplicateTaskError(
                f"Attempted to queue a duplicate of task ID {existing_task_id}",
                task_id=existing_task_id,
            )
        return self.AsyncResult(existing_task_id)

    # -- tasklock's guard ------------------------------------------------------------------------
    def _tasklock_pending_twin(self, task_id: str, args: Any, kwargs: Any) -> AsyncResult[Any]:
        return self.on_duplicate(task_id)

    def _compat_build_guard(self) -> CompatGuard:
        options: dict[str, Any] = {"limit": None, "dedupe_enqueue": True}
        expiry = self._expiry()
        if expiry is not None:
            options["pending_ttl"] = expiry
        return CompatGuard(
            self.name,
            options,
            conf=lambda: self._compat_app().conf,
            key=lambda args, kwargs: self.generate_lock(self.name, args, kwargs),
            markers=lambda: _BackendMarkers(self.singleton_backend),
            client=lambda: getattr(self.singleton_backend, "redis", None),
        )
