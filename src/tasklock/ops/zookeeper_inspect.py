"""ZooKeeper for ``tasklock ls/show/release/doctor`` and the admin page: the
:class:`tasklock.ops.stores.Store` of an ensemble, its URL check and its doctor.

Each name is a directory of contender nodes (see :mod:`tasklock.zookeeper.lock`); the holders are
the first node (a lock) or the permit nodes within their limit before any lock node
(:func:`~tasklock.zookeeper.lock.holders_among`); waiters are not listed. A hold's fence
is its node's creation zxid, which ``show`` names (there is no fence counter, as on etcd). A
release deletes the holder's node with the version that was read, so it removes exactly what was
shown; the holder's watchdog then finds its node gone and reports the hold lost. ``doctor`` also
sweeps what crashed processes left (empty lock directories, expired enqueue markers).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

from kazoo.exceptions import BadVersionError, NoNodeError

from tasklock.core.urls import redacted as redact_url
from tasklock.errors import BackendUnavailable, ConfigurationError
from tasklock.ops.doctor import Check, Report, Status
from tasklock.ops.inspect import KeyState, LockInfo, decode_key, newest_first, parse_lock_value
from tasklock.zookeeper.cleanup import sweep
from tasklock.zookeeper.client import Client, parse_url
from tasklock.zookeeper.lock import LOCK, holders_among, lock_directory, sequence_of

__all__ = ["FENCE_NOTE", "STORE", "ZooKeeperStore", "check_url", "run_doctor"]

FENCE_NOTE = (
    "none on ZooKeeper: the fence is the holder node's creation zxid, which ZooKeeper itself "
    "keeps strictly increasing"
)
_SEMAPHORE = "semaphore"


def check_url(url: str, option: str) -> str:
    """``url`` if it names a ZooKeeper ensemble, else a ConfigurationError naming ``option``."""
    try:
        parse_url(url)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{option}: {exc}") from None
    return url


class ZooKeeperStore:
    """The :class:`tasklock.ops.stores.Store` of a ZooKeeper ensemble."""

    fence_note: str | None = FENCE_NOTE
    backend = "ZooKeeper"

    def __init__(self, url: str, option: str) -> None:
        check_url(url, option)
        self.where = redact_url(url)
        self.client = Client(url)
        #: (path, version) of each hold read, by fence: a release deletes exactly that.
        self._nodes: dict[int, tuple[str, int]] = {}

    def close(self) -> None:
        self.client.close()

    def _holders(self, directory: str, name: str) -> list[LockInfo]:
        what = f"reading {name!r}"
        try:
            children = sorted(self.client.call(what, "get_children", directory), key=sequence_of)
        except NoNodeError:
            return []
        held: list[tuple[str, bytes, Any]] = []
        for child in holders_among(children):
            try:
                data, stat = self.client.call(what, "get", f"{directory}/{child}")
            except NoNodeError:
                continue
            held.append((child, bytes(data), stat))
        permits = sum(1 for child, _, _ in held if not child.startswith(LOCK + "-"))
        infos = []
        for child, data, stat in held:
            parsed = parse_lock_value(data)
            if parsed is None:
                continue
            self._nodes[stat.czxid] = (f"{directory}/{child}", stat.version)
            count = None if child.startswith(LOCK + "-") else permits
            holder = replace(parsed, fence=stat.czxid)
            infos.append(LockInfo(decode_key(name.encode()), data, holder, None, count))
        return infos

    def list_locks(self, match: bytes) -> list[LockInfo]:
        """Every held lock and permit whose name matches the glob ``match``, newest first."""
        root = self.client.path("tasklock", "locks")
        try:
            names = self.client.call("listing locks", "get_children", root)
        except NoNodeError:
            return []
        pattern = match.decode("utf-8", "surrogateescape")
        infos: list[LockInfo] = []
        for encoded in names:
            name = unquote(encoded)
            if fnmatch.fnmatchcase(name, pattern):
                infos += self._holders(f"{root}/{encoded}", name)
        return sorted(infos, key=newest_first)

    def read(self, key: str) -> KeyState:
        """A lock's holder, ``"semaphore"`` for a name held by permits, or nothing."""
        infos = self._holders(lock_directory(self.client, key), key)
        if not infos:
            return KeyState(key, "none", None, None)
        if infos[0].permits is not None:
            return KeyState(key, _SEMAPHORE, None, None)
        return KeyState(key, "string", infos[0].raw_value, None, infos[0])

    def is_semaphore(self, state: KeyState) -> bool:
        return state.type == _SEMAPHORE

    def permits(self, key: str) -> list[LockInfo]:
        infos = self._holders(lock_directory(self.client, key), key)
        return [info for info in infos if info.permits is not None]

    def fence_counters(
        self, key: str
    ) -> tuple[dict[str, int | None], dict[str, str], list[dict[str, Any]]]:
        return {}, {}, []

    def release(self, lock: LockInfo) -> bool:
        """Delete the holder's node if it is still the one read (by version); False when it
        changed."""
        path, version = self._nodes[lock.fence or 0]
        try:
            self.client.call(f"releasing {path!r}", "delete", path, version=version)
        except (NoNodeError, BadVersionError):
            return False
        return True

    def release_permit(self, key: str, permit: LockInfo) -> int:
        return 1 if self.release(permit) else 0


#: The :class:`tasklock.ops.stores.Store` of this backend, for the registry.
STORE = ZooKeeperStore


def run_doctor(urls: Sequence[str], option: str = "--url") -> Report:
    """Open a session on the ensemble and take and release a probe lock: each step a check."""
    checks: list[Check] = []
    shown = [redact_url(url) for url in urls]
    for url, where in zip(urls, shown, strict=True):
        check_url(url, option)
        client = Client(url)
        try:
            version = client.kazoo.server_version()
            checks.append(
                Check(
                    "session",
                    Status.OK,
                    f"session open ({client.session_timeout:g} s)",
                    None,
                    where,
                )
            )
            checks.append(
                Check("version", Status.OK, "ZooKeeper " + ".".join(map(str, version)), None, where)
            )
            checks.append(_probe(url, client, where))
            checks.append(_sweep(client, where))
        except (BackendUnavailable, ConfigurationError) as exc:
            checks.append(
                Check("session", Status.FAIL, str(exc), "check the URL and the ensemble", where)
            )
        finally:
            client.close()
    return Report(shown, checks)


def _sweep(client: Client, where: str) -> Check:
    """Remove what crashed processes left (empty lock directories, expired enqueue markers):
    safe while locks are in use (:mod:`tasklock.zookeeper.cleanup`)."""
    swept = sweep(client)
    return Check(
        "cleanup",
        Status.OK,
        f"removed {swept.directories} empty lock directories and {swept.markers} expired "
        f"enqueue markers ({swept.kept} lock directories in use)",
        None,
        where,
    )


def _probe(url: str, client: Client, where: str) -> Check:
    from tasklock.zookeeper.lock import Lock

    lock = Lock(client, "tasklock:doctor:probe", timeout=client.session_timeout, watchdog=False)
    if not lock.acquire(blocking=False):
        return Check(
            "lock probe", Status.WARN, "the probe lock is held by another doctor", None, where
        )
    fence = lock.fence
    lock.release()
    return Check("lock probe", Status.OK, f"took and released a lock (fence {fence})", None, where)
