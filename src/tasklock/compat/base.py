"""What the two compat modules share: a guard whose enqueue marker has the original library's key
and lives in the original's backend, and the task base that builds one guard per task instance.

Everything else (when the marker is claimed, returned, renewed and cleared; retries; revokes;
killed children; failed publishes) is :class:`tasklock.celery.SingletonTask`'s and
:class:`tasklock.pending.PendingMarkers`'s, composed here rather than copied.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, cast

from tasklock.backends import MarkerStore
from tasklock.celery import SingletonTask
from tasklock.errors import ConfigurationError
from tasklock.guard import Guard

__all__ = ["CompatGuard", "CompatTask"]


def _any_call(*args: Any, **kwargs: Any) -> None:
    """The signature the compat guard binds nothing against: its keys are the original's."""


class CompatGuard(Guard):
    """A :class:`~tasklock.guard.Guard` whose pending key and marker store are the original
    library's: ``key(args, kwargs)`` gives the key, ``markers()`` the store (resolved at each use,
    as the originals resolve their backend from the app's settings), ``client()`` the Redis the
    fleet counts go to (None: a backend without one)."""

    def __init__(
        self,
        name: str,
        options: Mapping[str, Any],
        *,
        conf: Callable[[], Mapping[str, Any] | None],
        key: Callable[[tuple[Any, ...], dict[str, Any]], str],
        markers: Callable[[], MarkerStore],
        client: Callable[[], Any],
    ) -> None:
        super().__init__(_any_call, name, options, conf=conf)
        self._key = key
        self._marker_store = markers
        self._store_client = client
        self._last = threading.local()

    def pending_key(self, args: Iterable[Any], kwargs: Mapping[str, Any]) -> str:
        """The original's key for this call. The same argument objects (one run's renewal and
        release) reuse the key computed first: a body that mutates a list it was passed cannot
        make the release miss its own marker, and the original's key function runs once."""
        last = getattr(self._last, "call", None)
        if last is not None and last[0] is args and last[1] is kwargs:
            return str(last[2])
        key = self._key(tuple(args), dict(kwargs))
        self._last.call = (args, kwargs, key)
        return key

    def _markers(self) -> MarkerStore:
        return self._marker_store()

    def _client(self) -> Any:
        client = self._store_client()
        if client is None:
            raise ConfigurationError(
                f"task {self.name}: its backend keeps no Redis client for tasklock's counts"
            )
        return client


class CompatTask(SingletonTask):
    """Base of ``QueueOnce`` and ``Singleton``: enqueue-time deduplication only, one guard per
    task instance (its key and backend come from the instance's app and options).

    A started run renews its marker first (for the marker's TTL from now): the original counted
    the TTL from the enqueue only, so a task that waited long in the queue lost its lock while it
    ran (celery-once #36/#127). The key is computed once per run and reused for the release.
    """

    tasklock: ClassVar[Mapping[str, Any]] = {"limit": None, "dedupe_enqueue": True}

    @property
    def tasklock_guard(self) -> Guard:
        guard = self.__dict__.get("_compat_guard")
        if guard is None or guard.name != self.name:
            guard = self.__dict__["_compat_guard"] = self._compat_build_guard()
        return guard

    def _compat_build_guard(self) -> CompatGuard:
        raise NotImplementedError

    def _compat_app(self) -> Any:
        """The task's app (Celery's ``_get_app``, which its type stubs do not show)."""
        return cast(Any, self)._get_app()

    def _compat_reset(self) -> None:
        """Forget the guard (the app's settings changed): rebuilt on next use."""
        self.__dict__.pop("_compat_guard", None)

    def _tasklock_execute(
        self, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, direct: bool
    ) -> Any:
        guard = self.tasklock_guard
        if not direct and request.id and guard.options.dedupe_enqueue is True:
            guard.keep_pending(args, kwargs, request.id)
        return super()._tasklock_execute(request, args, kwargs, direct=direct)
