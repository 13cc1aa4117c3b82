"""Where a task's locks and markers live: Redis (``url``/``urls``, the default) or etcd
(``url="etcd://h1:2379,h2:2379,h3:2379"``).

The task policy (:mod:`tasklock.guard`, :mod:`tasklock.pending`) is the same on both stores;
this module is the one place that knows which store a URL names, which lock class serves it, and
how an enqueue-time marker is claimed, renewed and cleared there. ``import tasklock`` does not
import httpx: the etcd half is imported only when a task's URL names etcd.

What etcd does not serve, refused with a clear error when the options are resolved:

* ``rate``: the rate limit is one Lua script on one Redis; a rate-limited task keeps a Redis
  ``url``.
* ``urls``: that is Redlock, a quorum of independent Redis masters. An etcd cluster is already a
  quorum: list its members in one ``url``.
* ``ttl`` below 1 s: etcd's leases are whole seconds (a TTL is rounded up, never down).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from tasklock.core.connection import backend_errors
from tasklock.core.scripts import CLAIM, DELETE_IF
from tasklock.errors import ConfigurationError

if TYPE_CHECKING:
    from tasklock.core.base import BaseLock
    from tasklock.etcd.client import Client

__all__ = [
    "ETCD_RATE_HINT",
    "ETCD_RATE_PROBLEM",
    "ETCD_URLS_PROBLEM",
    "MarkerStore",
    "RedisMarkers",
    "etcd_client",
    "etcd_lock",
    "etcd_markers",
    "etcd_option_problems",
    "etcd_url_problem",
    "is_etcd_url",
    "marker_store",
]

_ETCD_SCHEMES = ("etcd://", "etcds://")

ETCD_RATE_PROBLEM = (
    "rate with an etcd url is refused: a rate limit is one script on one Redis, which etcd "
    "cannot run"
)
ETCD_RATE_HINT = "give the rate-limited task a Redis url=, or drop rate for this task"
ETCD_URLS_PROBLEM = (
    "urls lists Redis masters for Redlock; an etcd cluster is already a quorum: name its "
    "members in one url, e.g. url='etcd://etcd1:2379,etcd2:2379,etcd3:2379'"
)


def is_etcd_url(url: object) -> bool:
    """Whether ``url`` names etcd (``etcd://`` or ``etcds://``) rather than Redis."""
    return isinstance(url, str) and url.lstrip()[:8].lower().startswith(_ETCD_SCHEMES)


def etcd_option_problems(options: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(option, message, hint, check code) for each option etcd cannot serve, when ``options``
    (one layer, or all merged) name an etcd ``url``."""
    if not is_etcd_url(options.get("url")):
        return []
    problems: list[tuple[str, str, str, str]] = []
    if options.get("rate") is not None:
        problems.append(("rate", ETCD_RATE_PROBLEM, ETCD_RATE_HINT, "E016"))
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


def etcd_url_problem(option: str, url: str) -> str | None:
    """What is wrong with an etcd URL given as ``option``, or None."""
    try:
        from tasklock.etcd import protocol
    except ImportError:
        return (
            f"{option}={url!r} names etcd, and tasklock's etcd backend needs httpx: "
            "pip install 'tasklock[etcd]'"
        )
    try:
        protocol.parse_endpoints(url)
    except ConfigurationError as exc:
        return f"{option}: {exc}"
    return None


# -- etcd clients and locks ----------------------------------------------------------------------
_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()


def etcd_client(url: str) -> Client:
    """One :class:`tasklock.etcd.Client` per URL per process (it is thread-safe, and makes its
    own connections again in a forked child)."""
    client = _clients.get(url)
    if client is None:
        from tasklock.etcd.client import Client

        with _clients_lock:
            client = _clients.get(url)
            if client is None:
                client = _clients[url] = Client(url)
    return client


def etcd_lock(url: str, key: str, limit: int | None, **common: Any) -> BaseLock:
    """The execution lock on etcd: a :class:`tasklock.etcd.Lock`, or with ``limit`` > 1 a
    :class:`tasklock.etcd.Semaphore` of that many permits on the same name (the two exclude
    each other there too). ``fence_key`` is dropped: etcd's revision is the fence."""
    common.pop("fence_key", None)
    client = etcd_client(url)
    if limit is not None and limit > 1:
        from tasklock.etcd import Semaphore

        return Semaphore(client, key, limit, **common)
    from tasklock.etcd import Lock

    return Lock(client, key, **common)


# -- enqueue-time markers ------------------------------------------------------------------------
class MarkerStore(Protocol):
    """The three operations :class:`tasklock.pending.PendingMarkers` needs of a store. ``what``
    says what the caller was doing, for the BackendUnavailable it raises when the store is
    unreachable."""

    def claim(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None: ...

    def renew(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None: ...

    def delete_if(self, key: str, task_id: str, what: str) -> bool: ...


class RedisMarkers:
    """Markers on Redis: the ``CLAIM`` and ``DELETE_IF`` scripts (and PEXPIRE to renew)."""

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
        with backend_errors(self.client, what):
            existing = CLAIM(self.client, (key,), (task_id, ttl_ms))
            if existing is not None:
                return existing.decode() if isinstance(existing, bytes) else str(existing)
            # Ours (claimed again, or still ours): a full TTL from now. Only our own run deletes
            # or replaces a marker that names a pending task, so it is still ours.
            self.client.pexpire(key, ttl_ms)
        return None

    def delete_if(self, key: str, task_id: str, what: str) -> bool:
        with backend_errors(self.client, what):
            return bool(DELETE_IF(self.client, (key,), (task_id,)))


_etcd_markers: dict[str, MarkerStore] = {}


def etcd_markers(url: str) -> MarkerStore:
    """The marker store on the etcd cluster ``url`` names."""
    store = _etcd_markers.get(url)
    if store is None:
        from tasklock.etcd.markers import Markers

        store = _etcd_markers.setdefault(url, Markers(etcd_client(url)))
    return store


def marker_store(url: str | None, redis_client: Callable[[], Any]) -> MarkerStore:
    """The marker store for a task whose ``url`` is given (``redis_client`` makes the Redis
    client when it is not etcd)."""
    if url is not None and is_etcd_url(url):
        return etcd_markers(url)
    return RedisMarkers(redis_client())
