"""Where ``tasklock ls/show/release/doctor`` look: Redis or etcd, chosen by the URL's scheme.

The commands in :mod:`tasklock.cli` are written once against :class:`Store`, so their text,
their ``--json``, their confirmations and their exit codes are the same on both backends and a
script written for one works on the other. :class:`RedisStore` wraps :mod:`tasklock.ops.inspect`
and :mod:`tasklock.ops.permits`; the etcd store lives in :mod:`tasklock.ops.etcd_inspect`, and
the etcd doctor in :mod:`tasklock.ops.etcd_doctor`. Both are imported only for an ``etcd://``
URL, so a Redis-only installation needs no httpx.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis

from tasklock.backends import is_etcd_url
from tasklock.core.connection import client_for_url
from tasklock.core.urls import validate_url
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
    "Counters",
    "RedisStore",
    "Store",
    "check_url",
    "connect",
    "doctor_for",
    "is_etcd_url",
    "open_store",
]

#: Fence counters to show: ``{counter key: value}``, ``{counter key: label}``, the same as JSON.
Counters = tuple[dict[str, int | None], dict[str, str], list[dict[str, Any]]]


def _etcd(module: str) -> Any:
    """:mod:`tasklock.ops.etcd_inspect` or ``etcd_doctor``; without httpx, a usage error that
    says what to install (rather than an ImportError traceback)."""
    try:
        return importlib.import_module(f"tasklock.ops.{module}")
    except ImportError as exc:
        raise ConfigurationError(
            f"etcd URLs need the etcd extra ({exc}): pip install 'tasklock[etcd]'"
        ) from None


def check_url(url: str, option: str) -> str:
    """``url`` if it is a usable Redis or etcd URL, else a ConfigurationError naming ``option``."""
    if is_etcd_url(url):
        return str(_etcd("etcd_inspect").check_url(url, option))
    return validate_url(url, option)


def connect(url: str, option: str) -> redis.Redis:
    """A client for ``url``; a URL redis-py cannot parse is a usage error naming ``option``."""
    try:
        return client_for_url(url)
    except ValueError as exc:
        if isinstance(exc, ConfigurationError):
            raise
        raise ConfigurationError(
            f"{option}={redact_url(url)!r} is not a usable Redis URL: {exc}"
        ) from exc


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

    def __init__(self, url: str, option: str) -> None:
        self.where = redact_url(url)
        self.client = connect(url, option)

    def close(self) -> None:
        self.client.close()

    def list_locks(self, match: bytes) -> list[LockInfo]:
        locks = [*list_locks(self.client, match), *list_permits(self.client, match)]
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


def open_store(url: str, option: str) -> Store:
    """The store ``url`` names; ``option`` (``--url``, ``TASKLOCK_URL``) is named in errors."""
    if is_etcd_url(url):
        store: Store = _etcd("etcd_inspect").EtcdStore(url, option)
        return store
    return RedisStore(url, option)


def doctor_for(
    urls: Sequence[str], option: str, ttl: float
) -> tuple[Report, Callable[[Report, bool], str]]:
    """Run the doctor for ``urls`` (Redis nodes, or the endpoints of one etcd cluster): the
    report and its text renderer. Mixing the two is a usage error."""
    etcd = [url for url in urls if is_etcd_url(url)]
    if not etcd:
        for url in urls:
            connect(url, option)  # a URL redis-py cannot parse is a usage error, before probing
        return run_doctor(urls, ttl=ttl), doctor_report
    if len(etcd) != len(urls):
        raise ConfigurationError(f"{option} mixes etcd and Redis URLs: check one backend at a time")
    doctor = _etcd("etcd_doctor")
    return doctor.run_doctor(urls, option), doctor.render
