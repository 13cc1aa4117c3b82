"""ZooKeeper's entry points for the backend registry (:mod:`tasklock.backends`): the hooks the
task layer, ``Leader`` and the enqueue markers call for a ``zookeeper://`` URL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasklock.core import backend_hooks
from tasklock.core.backend_hooks import PerCall, PerUrl, rate_refusal
from tasklock.core.base import BaseLock
from tasklock.zookeeper.client import client_for, parse_url
from tasklock.zookeeper.lock import Lock, Semaphore
from tasklock.zookeeper.markers import Markers

__all__ = [
    "count_clients",
    "lock",
    "lock_maker",
    "markers",
    "option_problems",
    "url_problem",
]

_markers = PerUrl(lambda url: Markers(client_for(url)))


def url_problem(option: str, url: str) -> str | None:
    """What is wrong with a ZooKeeper URL given as ``option``, or None."""
    return backend_hooks.url_problem(parse_url, option, url)


def option_problems(options: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(option, message, hint, check code) for each task option ZooKeeper cannot serve."""
    if options.get("rate") is None:
        return []
    return [rate_refusal("a zookeeper url", "ZooKeeper")]


def lock(url: str, key: str, limit: int | None, **common: Any) -> BaseLock:
    """The execution lock on ZooKeeper: a :class:`tasklock.zookeeper.Lock`, or with ``limit``
    > 1 a :class:`tasklock.zookeeper.Semaphore`. ``fence_key`` is dropped: the node's creation
    zxid is the fence."""
    common.pop("fence_key", None)
    if limit is not None and limit > 1:
        return Semaphore(client_for(url), key, limit, **common)
    return Lock(client_for(url), key, **common)


def markers(url: str) -> Markers:
    """The enqueue-marker store on the ensemble ``url`` names."""
    return _markers(url)


def lock_maker(url: str, limit: int | None, **common: Any) -> PerCall:
    """Each call's lock on ZooKeeper, made anew (the client is kept per URL)."""
    return PerCall(lock, url, limit, common)


def count_clients(url: str) -> list[Any]:
    """ZooKeeper keeps no fleet counts: tasks on it count in each process."""
    return []
