"""celery-once's file backend (``celery_once.backends.File``): markers as files in one directory,
for a single host (every producer and worker must see the same directory).

The file name is the original's (the key's start and its MD5), so the original and this module
exclude each other. A file holds ``<task id> <expiry, epoch seconds>``; an empty file (the
original's) expires ``timeout`` seconds after its modification time, as before. A task clears
only its own file (or an original's empty one). An expired file is first renamed away, so that of
two producers that both find it expired only one takes it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
import time
import uuid
from typing import Any

from tasklock.compat.celery_once.tasks import AlreadyQueued
from tasklock.errors import ConfigurationError

__all__ = ["File", "key_to_lock_name"]

#: Stands for the owner of an original's (empty) lock file, which records none.
LEGACY_OWNER = "celery-once"


def key_to_lock_name(key: str) -> str:
    """The key's start and its MD5, at most 50 characters (a safe file name)."""
    max_length = 50
    key_hash = hashlib.md5(key.encode()).hexdigest()  # a file name, not security
    return key[: max_length - len(key_hash) - 1] + "_" + key_hash


class File:
    """The file backend; setting ``location`` (default ``<tmp>/celery_once``)."""

    def __init__(self, settings: Any) -> None:
        location = settings.get("location") if hasattr(settings, "get") else None
        self.location = location or os.path.join(tempfile.gettempdir(), "celery_once")
        try:
            os.makedirs(self.location)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                return
            raise ConfigurationError(
                f"ONCE['settings']['location'] = {self.location!r} cannot be created: {exc}"
            ) from exc

    def _get_lock_path(self, key: str) -> str:
        return os.path.join(self.location, key_to_lock_name(key))

    def _read(self, path: str, ttl: float) -> tuple[str, float] | None:
        """(owner, expiry) of the file at ``path``, or None when there is none."""
        try:
            with open(path) as handle:
                text = handle.read().split()
            mtime = os.path.getmtime(path)
        except FileNotFoundError:
            return None
        if len(text) == 2:
            with contextlib.suppress(ValueError):
                return text[0], float(text[1])
        return LEGACY_OWNER, mtime + ttl

    def _create(self, path: str, task_id: str, ttl: float) -> bool:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                return False
            raise
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{task_id} {time.time() + ttl}")
        return True

    # -- the original's protocol -----------------------------------------------------------------
    def raise_or_lock(self, key: str, timeout: float) -> None:
        if self.claim(key, uuid.uuid4().hex, int(timeout * 1000), "celery-once lock") is not None:
            raise AlreadyQueued(self.countdown(key))

    def clear_lock(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._get_lock_path(key))

    # -- tasklock's marker store -----------------------------------------------------------------
    def claim(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        path, ttl = self._get_lock_path(key), ttl_ms / 1000
        owner = LEGACY_OWNER
        for _ in range(5):
            if self._create(path, task_id, ttl):
                return None
            found = self._read(path, ttl)
            if found is None:
                continue
            owner, expiry = found
            if owner == task_id:
                return None
            if expiry > time.time():
                return owner
            stale = f"{path}.stale.{uuid.uuid4().hex}"
            with contextlib.suppress(FileNotFoundError):
                os.rename(path, stale)  # only one of two producers renames it
                os.remove(stale)
        return owner

    def renew(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        path = self._get_lock_path(key)
        found = self._read(path, ttl_ms / 1000)
        if found is not None and found[0] != task_id:
            return found[0]
        if found is None:
            return self.claim(key, task_id, ttl_ms, what)
        temporary = f"{path}.{uuid.uuid4().hex}"
        with open(temporary, "w") as handle:
            handle.write(f"{task_id} {time.time() + ttl_ms / 1000}")
        os.replace(temporary, path)
        return None

    def delete_if(self, key: str, task_id: str, what: str) -> bool:
        path = self._get_lock_path(key)
        found = self._read(path, 0.0)
        if found is None or found[0] not in (task_id, LEGACY_OWNER):
            return False
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return True

    def countdown(self, key: str) -> float:
        found = self._read(self._get_lock_path(key), 0.0)
        return 0.0 if found is None else max(0.0, found[1] - time.time())
