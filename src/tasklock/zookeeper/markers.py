"""The task layer's enqueue-time markers (``dedupe_enqueue``) on ZooKeeper.

A marker must outlive the producer that wrote it (the worker clears it), so it cannot be an
ephemeral node: it is a persistent node ``<chroot>/tasklock/markers/<key, percent-encoded>``
holding ``<task id> <expiry, ms since the epoch>``. ZooKeeper has no TTL on a plain node, so a
marker past its expiry (by the wall clock of whoever reads it: markers are about pending work,
not safety, as on Redis) counts as absent and is replaced. Every write compares the version it
read (create only if absent, set and delete by version), so two producers racing for one marker
get one winner, as with the Redis scripts.
"""

from __future__ import annotations

import time
from urllib.parse import quote

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from tasklock.zookeeper.client import Client

__all__ = ["Markers"]

#: Tries of a claim that keeps losing races with other producers before it counts as held.
_TRIES = 5


def _encode(task_id: str, ttl_ms: int) -> bytes:
    return f"{task_id} {int(time.time() * 1000) + ttl_ms}".encode()


def _decode(data: bytes) -> tuple[str, int]:
    task_id, _, until = data.decode("utf-8", "replace").rpartition(" ")
    return task_id, int(until) if until.isdigit() else 0


class Markers:
    """Enqueue-time markers on one ensemble (thread-safe: the client is)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def _path(self, key: str) -> str:
        return self.client.path("tasklock", "markers", quote(key, safe="") or "%00")

    def _read(self, path: str, what: str) -> tuple[str, int, int] | None:
        """(task id, expiry ms, version) of a live marker, or None (absent or expired)."""
        try:
            data, stat = self.client.call(what, "get", path)
        except NoNodeError:
            return None
        task_id, until = _decode(bytes(data))
        return (
            (task_id, until, stat.version)
            if until > time.time() * 1000
            else ("", 0, -1 - stat.version)
        )

    def claim(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        """Mark ``key`` as pending under ``task_id`` for ``ttl_ms``; the id a twin's marker holds,
        or None (claimed now, or already this task's)."""
        path = self._path(key)
        for _ in range(_TRIES):
            try:
                self.client.call(what, "create", path, _encode(task_id, ttl_ms), makepath=True)
                return None
            except NodeExistsError:
                pass
            found = self._read(path, what)
            if found is None:
                continue
            holder, _, version = found
            if version >= 0:
                return None if holder == task_id else holder
            try:  # expired: take it over, unless someone else did first
                self.client.call(what, "set", path, _encode(task_id, ttl_ms), version=-1 - version)
                return None
            except (BadVersionError, NoNodeError):
                continue
        # Lost every race (markers of this key written and expiring as fast as we read them):
        # whoever holds it now is the twin; none at all, and this claim counts as made.
        found = self._read(path, what)
        return found[0] if found is not None and found[2] >= 0 and found[0] != task_id else None

    def renew(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        """:meth:`claim`, and a full ``ttl_ms`` from now for a marker that names ``task_id``."""
        path = self._path(key)
        found = self._read(path, what)
        if found is not None and found[2] >= 0 and found[0] == task_id:
            try:
                self.client.call(what, "set", path, _encode(task_id, ttl_ms), version=found[2])
                return None
            except (BadVersionError, NoNodeError):
                pass
        return self.claim(key, task_id, ttl_ms, what)

    def delete_if(self, key: str, task_id: str, what: str) -> bool:
        """Delete the marker at ``key`` if it names ``task_id``; whether it did."""
        path = self._path(key)
        try:
            data, stat = self.client.call(what, "get", path)
        except NoNodeError:
            return False
        if _decode(bytes(data))[0] != task_id:
            return False
        try:
            self.client.call(what, "delete", path, version=stat.version)
        except (BadVersionError, NoNodeError):
            return False
        return True

    def prune(self) -> int:
        """Delete every marker past its expiry; how many. Each by the version read, so a
        marker claimed or renewed meanwhile stays (ZooKeeper has no TTL on a plain node: a
        marker nobody claims again would stay for ever)."""
        root = self.client.path("tasklock", "markers")
        what = "pruning expired markers"
        try:
            keys = self.client.call(what, "get_children", root)
        except NoNodeError:
            return 0
        removed = 0
        for key in keys:
            found = self._read(f"{root}/{key}", what)
            if found is None or found[2] >= 0:
                continue  # (gone, or live)
            try:
                self.client.call(what, "delete", f"{root}/{key}", version=-1 - found[2])
            except (BadVersionError, NoNodeError):
                continue
            removed += 1
        return removed
