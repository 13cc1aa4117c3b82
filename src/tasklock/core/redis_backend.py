"""Redis's entry points for the backend registry (:mod:`tasklock.backends`): the same hooks as
``tasklock.etcd.backend`` and ``tasklock.zookeeper.backend``, so the task layer, ``Leader`` and the
enqueue markers build Redis's locks through the one seam too, and never ask which store they are
on.

A Redis *store* takes more forms than a URL: a redis-py client (the task's own, the broker's Redis
when no URL is set), a URL (one server, Cluster, Sentinel), or a list of URLs or clients (Redlock's
independent masters). Every hook here takes any of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tasklock.core.backend_hooks import PerCall
from tasklock.core.base import BaseLock
from tasklock.core.connection import backend_errors, client_for_url
from tasklock.core.lock import Lock
from tasklock.core.scripts import CLAIM, DELETE_IF
from tasklock.core.semaphore import Semaphore
from tasklock.core.urls import validate_url
from tasklock.errors import ConfigurationError

__all__ = [
    "RedisMarkers",
    "TemplateMaker",
    "count_clients",
    "lock",
    "lock_maker",
    "markers",
    "option_problems",
    "url_problem",
]


def _is_masters(store: Any) -> bool:
    """Whether ``store`` lists Redlock's masters (a list of URLs or clients, not one URL)."""
    return isinstance(store, Sequence) and not isinstance(store, str | bytes)


def _client(store: Any) -> Any:
    """The redis-py client of a one-server store (a URL, or a client as it is)."""
    return client_for_url(store) if isinstance(store, str) else store


def url_problem(option: str, url: object) -> str | None:
    """What is wrong with a Redis URL given as ``option`` (or with a value that is none), or
    None."""
    try:
        validate_url(url, option, etcd_too=True)
    except ConfigurationError as exc:
        return str(exc)
    return None


def option_problems(options: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Redis serves every task option (Redlock's own refusals are checked with the options)."""
    return []


def lock(store: Any, key: str, limit: int | None, **common: Any) -> BaseLock:
    """The lock on ``store``: a :class:`tasklock.Lock`, with ``limit`` > 1 a
    :class:`tasklock.Semaphore` of that many permits on the same key (a Lock and a Semaphore of
    one key exclude each other), and on a list of masters a :class:`tasklock.Redlock`."""
    if _is_masters(store):
        from tasklock.core.redlock import Redlock

        return Redlock(list(store), key, **common)
    if limit is not None and limit > 1:
        return Semaphore(_client(store), key, limit, **common)
    return Lock(_client(store), key, **common)


class TemplateMaker:
    """Each call's lock on one server, copied from a template made (and its options checked)
    once: :meth:`tasklock.Lock.for_name`. The template itself is never acquired."""

    __slots__ = ("_template", "store")

    def __init__(self, store: Any, template: Lock) -> None:
        self.store = store
        self._template = template

    def __call__(self, key: str, owner_info: Mapping[str, Any] | None) -> BaseLock:
        return self._template.for_name(key, owner_info=owner_info)


def lock_maker(store: Any, limit: int | None, **common: Any) -> Any:
    """What makes the lock of each call of one task on ``store`` (``maker(key, owner_info)``),
    for a caller that locks a new key per call with the same options: the options are checked
    here, once. ``maker.store`` is ``store``."""
    if _is_masters(store):
        return PerCall(lock, store, None, common)
    common.pop("owner_info", None)
    # Each call's lock is used by the one thread (or greenlet) that runs the call, so its holds
    # are kept on the object: a thread-local per call cost as much as the rest of the copy.
    template = lock(store, "tasklock:template", limit, thread_local=False, **common)
    assert isinstance(template, Lock)
    return TemplateMaker(store, template)


def count_clients(store: Any) -> list[Any]:
    """Where a task on ``store`` keeps its fleet counts: the client, or Redlock's masters in
    order (the first that answers)."""
    if _is_masters(store):
        return [_client(item) for item in store]
    return [_client(store)]


class RedisMarkers:
    """Markers on Redis: the ``CLAIM`` (which also renews) and ``DELETE_IF`` scripts."""

    __slots__ = ("client",)

    def __init__(self, client: Any) -> None:
        self.client = client

    def claim(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        with backend_errors(self.client, what):
            existing = CLAIM(self.client, (key,), (task_id, ttl_ms))
        if existing is None:
            return None
        return existing.decode() if isinstance(existing, bytes) else str(existing)

    def renew(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        # CLAIM gives a marker that is ours (claimed again, or still ours) a full TTL from now,
        # in the same round trip. Only our own run deletes or replaces a marker that names a
        # pending task, so one that is ours stays ours.
        return self.claim(key, task_id, ttl_ms, what)

    def delete_if(self, key: str, task_id: str, what: str) -> bool:
        with backend_errors(self.client, what):
            return bool(DELETE_IF(self.client, (key,), (task_id,)))


def markers(store: Any) -> RedisMarkers:
    """The enqueue markers of a task on ``store``: on its server, or Redlock's first master (a
    marker is about pending work, not safety: one node suffices)."""
    if _is_masters(store):
        return RedisMarkers(_client(store[0]))
    return RedisMarkers(_client(store))
