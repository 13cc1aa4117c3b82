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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tasklock.core.connection import backend_errors
from tasklock.core.scripts import CLAIM, DELETE_IF
from tasklock.core.urls import validate_url
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
    "etcd_cluster_url",
    "etcd_lock",
    "etcd_markers",
    "etcd_option_problems",
    "etcd_url_problem",
    "is_etcd_url",
    "is_redlock",
    "url_problems",
]

_ETCD_SCHEMES = ("etcd://", "etcds://")

ETCD_RATE_PROBLEM = (
    "rate with an etcd url is refused: a rate limit is one script on one Redis, which etcd "
    "cannot run"
)
ETCD_RATE_HINT = "give the rate-limited task a Redis url=, or drop rate for this task"
ETCD_URLS_PROBLEM = (
    "urls mixes etcd and Redis URLs: list the members of one etcd cluster (every URL etcd://) or "
    "the independent Redis masters of Redlock (none etcd://)"
)


def is_etcd_url(url: object) -> bool:
    """Whether ``url`` names etcd (``etcd://`` or ``etcds://``) rather than Redis."""
    return isinstance(url, str) and url.lstrip()[:8].lower().startswith(_ETCD_SCHEMES)


def etcd_cluster_url(urls: object) -> str | None:
    """``urls`` as one etcd URL when every item names etcd (``urls=["etcd://a:2379",
    "etcd://b:2379"]`` lists the members of one cluster, as ``url="etcd://a:2379,b:2379"``
    does); None for anything else."""
    if isinstance(urls, list | tuple) and urls and all(is_etcd_url(url) for url in urls):
        return ",".join(str(url).strip() for url in urls)
    return None


def is_redlock(urls: object) -> bool:
    """Whether ``urls`` names Redlock's masters (not the members of an etcd cluster)."""
    return urls is not None and etcd_cluster_url(urls) is None


Problem = tuple[str, str, str, str]  # (option, message, hint, check code)


def url_problems(url: object, urls: object) -> list[Problem]:
    """What is wrong with the ``url`` and ``urls`` options (one layer), in the words
    decoration-time validation uses: each URL checked part by part (a Redis URL by
    :func:`tasklock.core.urls.validate_url`, an etcd one by its endpoint parser)."""
    problems: list[Problem] = []
    if url is not None:
        message = _one_url_problem("url", url)
        if message:
            hint = (
                "e.g. etcd://h1:2379,h2:2379"
                if is_etcd_url(url)
                else "e.g. redis://localhost:6379/0"
            )
            problems.append(("url", message, hint, "E006"))
    if urls is None:
        return problems
    if isinstance(urls, str) or not isinstance(urls, Sequence) or not urls:
        problems.append(
            ("urls", f"urls must be a non-empty list of Redis URLs, got {urls!r}", "", "E006")
        )
    elif (cluster := etcd_cluster_url(urls)) is not None:
        message = etcd_url_problem("urls", cluster)
        if message:
            hint = "e.g. urls=['etcd://etcd1:2379', 'etcd://etcd2:2379']"
            problems.append(("urls", message, hint, "E006"))
    elif any(is_etcd_url(item) for item in urls):
        problems.append(("urls", ETCD_URLS_PROBLEM, "", "E006"))
    else:
        problems.extend(_redlock_problems(urls))
    return problems


def _one_url_problem(option: str, value: object, *, single_server: bool = False) -> str | None:
    if is_etcd_url(value) and not single_server:
        return etcd_url_problem(option, str(value))
    try:
        validate_url(value, option, single_server=single_server, etcd_too=not single_server)
    except ConfigurationError as exc:
        return str(exc)
    return None


def _redlock_problems(urls: Sequence[Any]) -> list[Problem]:
    problems: list[Problem] = []
    for index, url in enumerate(urls):
        message = _one_url_problem(f"urls[{index}]", url, single_server=True)
        if message:
            problems.append(("urls", message, "e.g. redis://node-1:6379/0", "E006"))
    if len(set(urls)) != len(urls):
        problems.append(("urls", f"urls lists the same server twice: {list(urls)!r}", "", "E006"))
    elif len(urls) % 2 == 0:
        n = len(urls)
        problems.append(
            (
                "urls",
                f"urls has {n} masters: Redlock needs {n // 2 + 1} of them, so it tolerates "
                f"{n // 2 - 1} failed master(s), no more than {n - 1} masters would",
                "use an odd number: 1 (no fault tolerance), 3 (tolerates 1) or 5 (tolerates 2)",
                "E006",
            )
        )
    return problems


def etcd_option_problems(options: Mapping[str, Any]) -> list[Problem]:
    """(option, message, hint, check code) for each option etcd cannot serve, when ``options``
    (one layer, or all merged) name etcd in ``url`` or ``urls``."""
    if not (is_etcd_url(options.get("url")) or etcd_cluster_url(options.get("urls"))):
        return []
    problems: list[Problem] = []
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
