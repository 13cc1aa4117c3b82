"""Where ``tasklock ls/show/release/doctor`` look: the backend the URL's scheme names in the
registry (:mod:`tasklock.backends`).

The commands in :mod:`tasklock.cli` are written once against :class:`Store`, so their text,
their ``--json``, their confirmations and their exit codes are the same on both backends and a
script written for one works on the other. :class:`RedisStore` wraps :mod:`tasklock.ops.inspect`
and :mod:`tasklock.ops.permits`; every other backend's store, URL check and doctor are in the
ops module its registry entry names (``tasklock.ops.etcd_inspect``,
``tasklock.ops.zookeeper_inspect``), imported only for a URL that names it, so a Redis-only
installation needs neither httpx nor kazoo.

Which URLs: :func:`resolve_url` and :func:`resolve_urls` apply the command line's order (the
option, then ``$TASKLOCK_URLS`` / ``$TASKLOCK_URL``, then the default) for every command alike.
A Redis Cluster URL is read node by node where a command scans (SCAN has a cursor per node), see
:func:`node_clients`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis

from tasklock.backends import backend_for
from tasklock.core.connection import client_for_url
from tasklock.core.urls import validate_url, without_query_option
from tasklock.errors import ConfigurationError
from tasklock.ops.doctor import Report, redact_url, run_doctor
from tasklock.ops.inspect import (
    KeyState,
    LockInfo,
    fence_counter_keys,
    key_text,
    list_locks,
    newest_first,
    read_fence_counters,
    read_key,
    release_if_unchanged,
)
from tasklock.ops.permits import list_permits, read_permits, release_permit
from tasklock.ops.render import doctor_report

__all__ = [
    "DEFAULT_URL",
    "URLS_ENV",
    "URL_ENV",
    "Counters",
    "RedisStore",
    "Store",
    "backend_of",
    "check_url",
    "connect",
    "doctor_for",
    "node_clients",
    "open_store",
    "resolve_url",
    "resolve_urls",
    "split_urls",
]

DEFAULT_URL = "redis://localhost:6379/0"
URL_ENV = "TASKLOCK_URL"
URLS_ENV = "TASKLOCK_URLS"

#: Fence counters to show: ``{counter key: value}``, ``{counter key: label}``, the same as JSON.
Counters = tuple[dict[str, int | None], dict[str, str], list[dict[str, Any]]]


def check_url(url: str, option: str) -> str:
    """``url`` if it is a usable URL of its backend, else a ConfigurationError naming
    ``option``."""
    backend = backend_for(url)
    if backend.external:
        return str(backend.load_ops().check_url(url, option))
    return validate_url(url, option, etcd_too=True)


def connect(url: str, option: str) -> redis.Redis:
    """A client for ``url``; a URL redis-py cannot parse is a usage error naming ``option``.
    The commands read keys and values as bytes (a key need not be UTF-8), so a URL's
    ``decode_responses`` (which an application's own clients may well use) is left out here."""
    if "decode_responses" in url:
        url = without_query_option(url, "decode_responses")
    try:
        return client_for_url(url)
    except ValueError as exc:
        if isinstance(exc, ConfigurationError):
            raise
        raise ConfigurationError(
            f"{option}={redact_url(url)!r} is not a usable Redis URL: {exc}"
        ) from exc


def split_urls(text: str) -> list[str]:
    """The URLs in a comma-separated list (``--urls a,b``, ``$TASKLOCK_URLS``). A comma also
    separates the hosts of one Redis Cluster or Sentinel URL (``redis+cluster://h1:1,h2:2``), so
    a part with no ``://`` of its own belongs to the URL before it. An etcd URL is one cluster,
    its hosts after commas, so it is never split (nor is a ZooKeeper one)."""
    if backend_for(text.strip()).one_url_per_cluster:
        return [text.strip()]
    urls: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if urls and "://" not in part:
            urls[-1] += "," + part
        else:
            urls.append(part)
    return urls


def resolve_url(given: str | None) -> tuple[str, str]:
    """``(url, where it came from)``: ``--url``, else ``$TASKLOCK_URL``, else the default."""
    if given is not None:
        return check_url(given, "--url"), "--url"
    env = os.environ.get(URL_ENV, "").strip()
    if env:
        return check_url(env, URL_ENV), URL_ENV
    return DEFAULT_URL, "the default URL"


def resolve_urls(url: str | None, urls: Sequence[str] | None) -> tuple[list[str], str]:
    """The nodes of a command that reads several (Redlock's masters) and where they came from:
    ``--urls`` (each value may list several, comma-separated), ``--url``, ``$TASKLOCK_URLS``,
    then as for :func:`resolve_url`."""
    if urls:
        listed = [u for value in urls for u in split_urls(value)]
        return [check_url(u, "--urls") for u in listed], "--urls"
    if url is not None:
        return [check_url(url, "--url")], "--url"
    env = os.environ.get(URLS_ENV, "").strip()
    if env:
        return [check_url(u, URLS_ENV) for u in split_urls(env)], URLS_ENV
    single, origin = resolve_url(None)
    return [single], origin


def node_clients(client: Any) -> list[Any]:
    """The clients to scan with: each master of a Redis Cluster (SCAN walks one node's keys,
    with a cursor of its own, and redis-py's cluster SCAN answers a cursor per node, which the
    listing cannot page with), else ``client`` itself."""
    primaries = getattr(client, "get_primaries", None)
    if primaries is None:
        return [client]
    return [client.get_redis_connection(node) for node in primaries()]


class Store(Protocol):
    """What the commands read and release, whatever the backend."""

    #: The URL for messages, password hidden.
    where: str
    #: What ``show`` says instead of fence counters when the backend has none (etcd).
    fence_note: str | None

    def list_locks(self, match: bytes) -> list[LockInfo]: ...

    def read(self, key: str) -> KeyState: ...

    def is_semaphore(self, state: KeyState) -> bool: ...

    def permits(self, key: str) -> list[LockInfo]: ...

    def fence_counters(self, key: str) -> Counters: ...

    def release(self, lock: LockInfo) -> bool: ...

    def release_permit(self, key: str, permit: LockInfo) -> int: ...

    def close(self) -> None: ...


class RedisStore:
    """The :class:`Store` of one Redis URL (a server, a cluster or a Sentinel master)."""

    fence_note: str | None = None
    #: The backend's name in messages ("kept in Redis").
    backend = "Redis"

    def __init__(self, url: str, option: str) -> None:
        self.where = redact_url(url)
        self.client = connect(url, option)

    def close(self) -> None:
        self.client.close()

    def list_locks(self, match: bytes) -> list[LockInfo]:
        locks: list[LockInfo] = []
        for client in node_clients(self.client):  # every master of a cluster
            locks += [*list_locks(client, match), *list_permits(client, match)]
        return sorted(locks, key=newest_first)

    def read(self, key: str) -> KeyState:
        return read_key(self.client, key)

    def is_semaphore(self, state: KeyState) -> bool:
        return state.type == "zset"

    def permits(self, key: str) -> list[LockInfo]:
        return read_permits(self.client, key)

    def fence_counters(self, key: str) -> Counters:
        candidates = fence_counter_keys(key)
        counters = read_fence_counters(self.client, [counter for _, counter in candidates])
        # Show the counters that exist; when none does, the most likely one as "not set".
        counters = {k: v for k, v in counters.items() if v is not None} or {candidates[0][1]: None}
        labels = {key: label for label, key in candidates}
        as_json = [
            {"key": key_text(counter), "kind": labels[counter], "value": counters[counter]}
            for counter in counters
        ]
        return counters, labels, as_json

    def release(self, lock: LockInfo) -> bool:
        return release_if_unchanged(self.client, lock.key, lock.raw_value)

    def release_permit(self, key: str, permit: LockInfo) -> int:
        return release_permit(self.client, key, permit.raw_value)


def backend_of(store: Store) -> str:
    """The name of the backend ``store`` reads, for messages: "Redis", "etcd", "ZooKeeper"."""
    return str(getattr(store, "backend", "etcd"))


def open_store(url: str, option: str) -> Store:
    """The store ``url`` names; ``option`` (``--url``, ``TASKLOCK_URL``) is named in errors."""
    backend = backend_for(url)
    if backend.external:
        store: Store = backend.load_ops().STORE(url, option)
        return store
    return RedisStore(url, option)


def doctor_for(
    urls: Sequence[str], option: str, ttl: float
) -> tuple[Report, Callable[[Report, bool], str]]:
    """Run the doctor for ``urls`` (Redis nodes, or the endpoints of one etcd cluster): the
    report and its text renderer. Mixing the two is a usage error."""
    backends = {backend_for(url) for url in urls}
    if len(backends) > 1:
        names = " and ".join(sorted((backend.name for backend in backends), key=str.lower))
        raise ConfigurationError(f"{option} mixes {names} URLs: check one backend at a time")
    backend = backends.pop()
    if not backend.external:
        for url in urls:
            connect(url, option)  # a URL redis-py cannot parse is a usage error, before probing
        return run_doctor(urls, ttl=ttl), doctor_report
    report = backend.load_ops().run_doctor(urls, option)
    title = f"tasklock doctor ({backend.name}, {len(report.urls)} endpoint(s))"
    return report, functools.partial(doctor_report, title=title)
