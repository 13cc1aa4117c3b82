"""etcd's entry points for the backend registry (:mod:`tasklock.backends`): the hooks the task
layer, ``Leader`` and the enqueue markers call for an ``etcd://`` URL. Only what the backend
does differently is here; the policy that calls it is written once, above the registry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasklock.core import backend_hooks
from tasklock.core.backend_hooks import PerCall, PerUrl, rate_refusal
from tasklock.core.base import BaseLock
from tasklock.etcd import protocol
from tasklock.etcd.client import Client
from tasklock.etcd.markers import Markers

__all__ = [
    "client",
    "count_clients",
    "lock",
    "lock_maker",
    "markers",
    "option_problems",
    "url_problem",
]

_clients = PerUrl(Client)
_markers = PerUrl(lambda url: Markers(client(url)))


def client(url: str) -> Client:
    """One :class:`tasklock.etcd.Client` per URL per process (it is thread-safe, and makes its
    own connections again in a forked child)."""
    return _clients(url)


def url_problem(option: str, url: str) -> str | None:
    """What is wrong with an etcd URL given as ``option``, or None."""
    return backend_hooks.url_problem(protocol.parse_endpoints, option, url)


def option_problems(options: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(option, message, hint, check code) for each task option etcd cannot serve."""
    problems: list[tuple[str, str, str, str]] = []
    if options.get("rate") is not None:
        problems.append(rate_refusal("an etcd url", "etcd"))
    ttl = options.get("ttl")
    if isinstance(ttl, int | float) and not isinstance(ttl, bool) and 0 < ttl < 1:
        problems.append(
            (
                "ttl",
                f"ttl={ttl!r} with an etcd url: etcd leases are whole seconds, at least 1",
                "set ttl=1 or more for a task on etcd",
                "E017",
            )
        )
    return problems


def lock(url: str, key: str, limit: int | None, **common: Any) -> BaseLock:
    """The execution lock on etcd: a :class:`tasklock.etcd.Lock`, or with ``limit`` > 1 a
    :class:`tasklock.etcd.Semaphore` of that many permits on the same name (the two exclude
    each other there too). ``fence_key`` is dropped: etcd's revision is the fence."""
    common.pop("fence_key", None)
    if limit is not None and limit > 1:
        from tasklock.etcd.semaphore import Semaphore

        return Semaphore(client(url), key, limit, **common)
    from tasklock.etcd.lock import Lock

    return Lock(client(url), key, **common)


def markers(url: str) -> Markers:
    """The enqueue-marker store on the etcd cluster ``url`` names."""
    return _markers(url)


def lock_maker(url: str, limit: int | None, **common: Any) -> PerCall:
    """Each call's lock on etcd, made anew (the client is kept per URL)."""
    return PerCall(lock, url, limit, common)


def count_clients(url: str) -> list[Any]:
    """etcd keeps no fleet counts: tasks on it count in each process."""
    return []
