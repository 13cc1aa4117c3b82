"""Where a task's locks and markers live: the one registry of backends, chosen by URL scheme.

Every store tasklock runs on is a :class:`Backend` entry in :data:`REGISTRY`, looked up by the
scheme of a URL (:func:`backend_for`), as ``limits`` looks up a storage by its ``STORAGE_SCHEME``
and tooz a coordination driver by its URL. The task policy (:mod:`tasklock.guard`,
:mod:`tasklock.pending`, :mod:`tasklock.leader`, beat, the exporter, the admin page and the
``tasklock`` commands) asks the entry what it needs and never tests a scheme itself:

* Every backend names a *hooks* module (:class:`Hooks`): ``tasklock.core.redis_backend`` for
  Redis (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``, ``redis+sentinel://``,
  ``urls=[...]`` for Redlock, and a redis-py client: the default for anything that is not a URL
  of another backend, whose errors then come from Redis's URL parser), and one in each other
  backend's own package (``tasklock.etcd.backend``, ``tasklock.zookeeper.backend``), imported only
  when a URL names it, so ``import tasklock`` imports neither httpx nor kazoo; and an *ops*
  module (``tasklock.ops.etcd_inspect``, ...) that ``tasklock ls/show/release/doctor`` and the
  admin page read through. Adding a backend is its package, its ops module and one entry here.

What a backend other than Redis does not serve is said per backend by its hooks'
``option_problems`` (etcd and ZooKeeper: no ``rate``, which is a Lua script on one Redis), and
refused with a clear error when the options are resolved.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from tasklock.core.redis_backend import RedisMarkers
from tasklock.core.urls import validate_url
from tasklock.errors import ConfigurationError

if TYPE_CHECKING:
    from tasklock.core.base import BaseLock

__all__ = [
    "ETCD",
    "REDIS",
    "REGISTRY",
    "ZOOKEEPER",
    "Backend",
    "Hooks",
    "LockMaker",
    "MarkerStore",
    "RedisMarkers",
    "backend_for",
    "cluster_url",
    "is_external",
    "is_redlock",
    "lock_on",
    "markers_on",
    "option_problems",
    "url_problems",
]

Problem = tuple[str, str, str, str]  # (option, message, hint, check code)


class MarkerStore(Protocol):
    """The three operations :class:`tasklock.pending.PendingMarkers` needs of a store. ``what``
    says what the caller was doing, for the BackendUnavailable it raises when the store is
    unreachable."""

    def claim(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None: ...

    def renew(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None: ...

    def delete_if(self, key: str, task_id: str, what: str) -> bool: ...


class LockMaker(Protocol):
    """Makes the lock of each call of one task (``maker(key, owner_info)``), with the options
    given to :meth:`Hooks.lock_maker` checked there once: the task layer locks a new key per
    call, and checking them again on every call was a good part of a call's cost."""

    #: The store it makes locks on (the task layer makes a new maker when its store changes).
    store: Any

    def __call__(self, key: str, owner_info: Mapping[str, Any] | None) -> BaseLock: ...


class Hooks(Protocol):
    """What a backend's hooks module provides. A *store* is what the task's options name: a URL
    (and for Redis also a redis-py client, or a list of Redlock's masters)."""

    def url_problem(self, option: str, url: str) -> str | None:
        """What is wrong with ``url`` given as ``option``, or None."""
        ...

    def option_problems(self, options: Mapping[str, Any]) -> list[Problem]:
        """(option, message, hint, check code) for each task option the backend cannot serve."""
        ...

    def lock(self, store: Any, key: str, limit: int | None, **common: Any) -> BaseLock:
        """The execution lock (``limit`` > 1: a semaphore of that many permits on the same
        name), with :class:`tasklock.Lock`'s keyword arguments (``fence_key`` may be given and
        is dropped where the store's own ordering is the fence)."""
        ...

    def lock_maker(self, store: Any, limit: int | None, **common: Any) -> LockMaker:
        """What makes :meth:`lock`'s lock for each call's key (``owner_info`` given per call)."""
        ...

    def count_clients(self, store: Any) -> list[Any]:
        """The Redis clients a task on ``store`` writes its fleet counts to (the first that
        answers), or none where the store keeps no counts."""
        ...

    def markers(self, store: Any) -> MarkerStore:
        """The enqueue-marker store on ``store``."""
        ...


@dataclass(frozen=True)
class Backend:
    """One registry entry: a store tasklock runs on, and where its code lives."""

    #: The store's name in messages ("Redis", "etcd", "ZooKeeper").
    name: str
    #: The URL schemes that select it (lower case, without ``://``).
    schemes: tuple[str, ...]
    #: The module of its :class:`Hooks`.
    hooks: str
    #: The module in :mod:`tasklock.ops` with ``check_url``, its ``Store`` class (``STORE``
    #: names it) and ``run_doctor``, for the ``tasklock`` commands and the admin page.
    ops: str
    #: The pip extra that installs its client library ("" when none is needed).
    extra: str
    #: An example URL, for hints.
    example: str
    #: Whether the fleet's counts (``tasklock stats``, the exporter, the admin page's counts)
    #: are kept there; else tasks count in each process only (:mod:`tasklock.stats`).
    keeps_counts: bool
    #: Whether one URL lists a whole cluster after commas (never split into several URLs).
    one_url_per_cluster: bool
    #: Whether it is a store other than Redis (which also takes clients and Redlock's lists,
    #: and is the default for anything that names no other backend).
    external: bool = True

    def load_hooks(self) -> Hooks:
        """The hooks module; without the client library, a ConfigurationError that says what
        to install (rather than an ImportError from deep inside)."""
        try:
            return cast(Hooks, importlib.import_module(self.hooks))
        except ImportError as exc:
            raise ConfigurationError(self.missing(exc)) from None

    def load_ops(self) -> Any:
        """The ops module (``check_url``, ``STORE``, ``run_doctor``), as :meth:`load_hooks`."""
        try:
            return importlib.import_module(self.ops)
        except ImportError as exc:
            raise ConfigurationError(self.missing(exc)) from None

    def missing(self, exc: ImportError) -> str:
        """The message for a client library that is not installed."""
        return (
            f"{self.name} URLs need the {self.extra} extra ({exc}): "
            f"pip install 'tasklock[{self.extra}]'"
        )


REDIS = Backend(
    name="Redis",
    schemes=("redis", "rediss", "unix", "redis+cluster", "redis+sentinel"),
    hooks="tasklock.core.redis_backend",
    ops="tasklock.ops.stores",
    extra="",
    example="redis://localhost:6379/0",
    keeps_counts=True,
    one_url_per_cluster=False,
    external=False,
)
ETCD = Backend(
    name="etcd",
    schemes=("etcd", "etcds"),
    hooks="tasklock.etcd.backend",
    ops="tasklock.ops.etcd_inspect",
    extra="etcd",
    example="etcd://h1:2379,h2:2379",
    keeps_counts=False,
    one_url_per_cluster=True,
)

ZOOKEEPER = Backend(
    name="ZooKeeper",
    schemes=("zookeeper", "zk"),
    hooks="tasklock.zookeeper.backend",
    ops="tasklock.ops.zookeeper_inspect",
    extra="zookeeper",
    example="zookeeper://zk1:2181,zk2:2181,zk3:2181/tasklock",
    keeps_counts=False,
    one_url_per_cluster=True,
)

#: Every backend, by URL scheme: the one place a scheme is looked up.
REGISTRY: dict[str, Backend] = {
    scheme: backend for backend in (REDIS, ETCD, ZOOKEEPER) for scheme in backend.schemes
}


def backend_for(url: object) -> Backend:
    """The backend ``url``'s scheme names; :data:`REDIS` for anything else (a client object, a
    list of Redlock masters, a URL Redis's parser will then judge)."""
    if not isinstance(url, str):
        return REDIS
    scheme, sep, _ = url.strip().partition("://")
    return REGISTRY.get(scheme.lower(), REDIS) if sep else REDIS


def is_external(url: object) -> bool:
    """Whether ``url`` names a backend other than Redis (etcd, ZooKeeper)."""
    return backend_for(url).external


def lock_on(store: Any, key: str, limit: int | None, **common: Any) -> BaseLock:
    """The lock on ``store`` (a URL of any backend, a redis-py client, or Redlock's masters)."""
    return backend_for(store).load_hooks().lock(store, key, limit, **common)


def markers_on(store: Any) -> MarkerStore:
    """The enqueue-marker store on ``store`` (as :func:`lock_on`)."""
    return backend_for(store).load_hooks().markers(store)


def cluster_url(urls: object) -> str | None:
    """``urls`` as one URL when every item names the same backend that lists a cluster in one
    URL (``urls=["etcd://a:2379", "etcd://b:2379"]`` is ``url="etcd://a:2379,b:2379"``); None
    for anything else."""
    if not isinstance(urls, list | tuple) or not urls:
        return None
    backends = {backend_for(url) for url in urls}
    if len(backends) != 1 or not next(iter(backends)).one_url_per_cluster:
        return None
    return ",".join(str(url).strip() for url in urls)


def is_redlock(urls: object) -> bool:
    """Whether ``urls`` names Redlock's masters (not the members of one cluster)."""
    return urls is not None and cluster_url(urls) is None


def _url_problem(option: str, url: object) -> str | None:
    backend = backend_for(url)
    try:
        hooks = backend.load_hooks()
    except ConfigurationError as exc:
        return f"{option}={url!r} names {backend.name}, and {exc}"
    return hooks.url_problem(option, cast(str, url))  # (Redis's also judges a non-text one)


def _mix_problem(urls: Sequence[Any]) -> str:
    names = sorted({backend_for(url).name for url in urls if backend_for(url).external})
    return (
        f"urls mixes {' and '.join(names)} and Redis URLs: list the members of one "
        f"{names[0]} cluster (every URL {backend_for(urls[0]).schemes[0]}://) or the independent "
        "Redis masters of Redlock (none of another backend)"
        if len(names) == 1
        else f"urls mixes {', '.join(names)} URLs: list the members of one cluster"
    )


def url_problems(url: object, urls: object) -> list[Problem]:
    """What is wrong with the ``url`` and ``urls`` options (one layer), in the words
    decoration-time validation uses: each URL checked part by part by its backend (a Redis URL
    by :func:`tasklock.core.urls.validate_url`, any other by its hooks' ``url_problem``)."""
    problems: list[Problem] = []
    if url is not None:
        message = _url_problem("url", url)
        if message:
            problems.append(("url", message, f"e.g. {backend_for(url).example}", "E006"))
    if urls is None:
        return problems
    if isinstance(urls, str) or not isinstance(urls, Sequence) or not urls:
        problems.append(
            ("urls", f"urls must be a non-empty list of Redis URLs, got {urls!r}", "", "E006")
        )
    elif (cluster := cluster_url(urls)) is not None:
        message = _url_problem("urls", cluster)
        if message:
            first = backend_for(cluster).example.partition(",")[0]
            hint = f"e.g. urls=['{first}', ...]"
            problems.append(("urls", message, hint, "E006"))
    elif any(is_external(item) for item in urls):
        problems.append(("urls", _mix_problem(urls), "", "E006"))
    else:
        problems.extend(_redlock_problems(urls))
    return problems


def _redlock_problems(urls: Sequence[Any]) -> list[Problem]:
    problems: list[Problem] = []
    for index, url in enumerate(urls):
        try:
            validate_url(url, f"urls[{index}]", single_server=True)
        except ConfigurationError as exc:
            problems.append(("urls", str(exc), "e.g. redis://node-1:6379/0", "E006"))
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


def option_problems(options: Mapping[str, Any]) -> list[Problem]:
    """(option, message, hint, check code) for each option the backend that ``options`` (one
    layer, or all merged) name in ``url`` or ``urls`` cannot serve."""
    url = options.get("url")
    if not is_external(url):
        url = cluster_url(options.get("urls"))
    if url is None or not is_external(url):
        return []
    try:
        hooks = backend_for(url).load_hooks()
    except ConfigurationError:
        return []  # (url_problems says what to install)
    return hooks.option_problems(options)
