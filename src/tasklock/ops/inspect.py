"""Reading tasklock's lock keys as an operator sees them: who holds what, for how long, fenced how.

Only values that tasklock wrote are treated as locks: ``<32 hex token> <JSON owner metadata>``
followed by ``#<fence>`` (see :mod:`tasklock.core.owner` and :mod:`tasklock.core.scripts`). That
filter is what keeps fence counters (integers), enqueue markers (a task id) and other libraries'
keys out of ``tasklock ls``, and what stops ``tasklock release`` from deleting a key tasklock did
not write. A Redlock node holds the bare ``<token> <meta>`` (no fence yet) for the moment between
its two rounds, so a missing fence is accepted and shown as unknown.

Listing uses SCAN (never KEYS, which blocks the server) with ``TYPE string`` where the server
supports it (Redis 6.0+), and reads each page's values and TTLs in one pipelined round trip.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions as redis_errors

from tasklock.core.connection import backend_errors
from tasklock.core.keys import fence_key_for, wake_channel
from tasklock.core.owner import Holder, parse_value
from tasklock.core.scripts import RELEASE

__all__ = [
    "KeyState",
    "LockInfo",
    "fence_counter_keys",
    "list_locks",
    "parse_lock_value",
    "read_fence_counters",
    "read_key",
    "release_if_unchanged",
]

#: Keys per SCAN call: large enough for few round trips, small enough not to stall the server.
SCAN_COUNT = 1000

_TOKEN = re.compile(r"[0-9a-f]{32}")
# The task layer's execution lock: <prefix>:{<task name>}:lock:<digest>, with its fence counter
# at <prefix>:{<task name>}:fence (one counter per task name, in the lock's cluster slot).
_TASK_LOCK_KEY = re.compile(r"(?P<base>.*\{[^{}]+\}):lock:[^{}]+")


def parse_lock_value(value: bytes | str) -> Holder | None:
    """The holder described by ``value`` if tasklock wrote it as a lock value, else None.

    Stricter than :func:`tasklock.core.owner.parse_value` (which reads any value as a bare token):
    the token must be 32 lowercase hex digits and the metadata a JSON object naming host and pid.
    """
    holder = parse_value(value)
    if not _TOKEN.fullmatch(holder.token):
        return None
    if "host" not in holder.meta or "pid" not in holder.meta:
        return None
    return holder


def _decode_key(key: bytes | str) -> str:
    return key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else key


@dataclass(frozen=True)
class LockInfo:
    """One held lock: its key, the raw stored value, the parsed holder and the TTL left."""

    key: str
    raw_value: bytes
    holder: Holder
    ttl_ms: int | None  # None: the key has no TTL (tasklock never writes one without)

    @property
    def fence(self) -> int | None:
        return self.holder.fence

    @property
    def meta(self) -> dict[str, Any]:
        return self.holder.meta

    @property
    def host(self) -> str | None:
        value = self.meta.get("host")
        return None if value is None else str(value)

    @property
    def pid(self) -> int | None:
        value = self.meta.get("pid")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def task(self) -> str | None:
        """The task or job id, for locks taken by the task layer."""
        value = self.meta.get("task")
        return None if value is None else str(value)

    @property
    def task_name(self) -> str | None:
        value = self.meta.get("name")
        return None if value is None else str(value)

    @property
    def acquired_at(self) -> float | None:
        """Wall-clock acquisition time on the holder's host (display and ordering only)."""
        value = self.meta.get("at")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) if math.isfinite(value) else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; the field names are a stable interface for scripts."""
        return {
            "key": self.key,
            "host": self.host,
            "pid": self.pid,
            "task": self.task,
            "task_name": self.task_name,
            "acquired_at": self.acquired_at,
            "ttl_ms": self.ttl_ms,
            "fence": self.fence,
            "token": self.holder.token,
            "meta": self.meta,
            "value": self.holder.value,
        }


def _lock_info(key: bytes | str, value: Any, pttl: Any) -> LockInfo | None:
    """A LockInfo from one GET + PTTL answer, or None when it is not a held tasklock lock."""
    if not isinstance(value, bytes | str) or isinstance(pttl, BaseException):
        return None  # WRONGTYPE (no TYPE filter on old servers) or the key vanished
    if pttl == -2:
        return None  # expired between GET and PTTL
    holder = parse_lock_value(value)
    if holder is None:
        return None
    raw = value.encode() if isinstance(value, str) else value
    return LockInfo(_decode_key(key), raw, holder, int(pttl) if pttl >= 0 else None)


def _scan_pages(client: Any, match: str) -> Iterator[list[bytes]]:
    """Pages of keys matching ``match``, string keys only when the server can filter by type."""
    type_filter: str | None = "string"
    cursor = 0
    while True:
        try:
            cursor, keys = client.scan(cursor, match=match, count=SCAN_COUNT, _type=type_filter)
        except redis_errors.ResponseError:
            if type_filter is None or cursor != 0:
                raise
            type_filter = None  # Redis < 6.0 has no TYPE option: filter by reading values
            continue
        yield list(keys)
        if int(cursor) == 0:
            return


def list_locks(client: Any, match: str = "*") -> list[LockInfo]:
    """Every held tasklock lock whose key matches ``match`` (a SCAN glob), newest first.

    Newest means the latest ``at`` in the owner metadata; locks without one come last. Keys that
    change while the scan runs may or may not be listed (SCAN's guarantee), never twice.
    """
    locks: dict[str, LockInfo] = {}
    with backend_errors(client, f"listing locks matching {match!r}"):
        for page in _scan_pages(client, match):
            keys = [k for k in page if not k.endswith(b":fence")]
            if not keys:
                continue
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
                pipe.pttl(key)
            answers = pipe.execute(raise_on_error=False)
            for i, key in enumerate(keys):
                info = _lock_info(key, answers[2 * i], answers[2 * i + 1])
                if info is not None:
                    locks[info.key] = info
    return sorted(locks.values(), key=_newest_first)


def _newest_first(info: LockInfo) -> tuple[bool, float, str]:
    at = info.acquired_at
    return (at is None, -(at or 0.0), info.key)


@dataclass(frozen=True)
class KeyState:
    """What one key holds right now, read atomically (one MULTI/EXEC)."""

    key: str
    type: str  # Redis TYPE: "none" when the key does not exist
    raw_value: bytes | None
    ttl_ms: int | None
    lock: LockInfo | None = field(default=None)

    @property
    def exists(self) -> bool:
        return self.type != "none"


def read_key(client: Any, key: str) -> KeyState:
    """The type, value, TTL and (when it is a tasklock lock) parsed holder of ``key``."""
    with backend_errors(client, f"reading {key!r}"):
        pipe = client.pipeline(transaction=True)
        pipe.type(key)
        pipe.get(key)
        pipe.pttl(key)
        kind, value, pttl = pipe.execute(raise_on_error=False)
    kind_text = kind.decode() if isinstance(kind, bytes) else str(kind)
    if kind_text != "string" or not isinstance(value, bytes | str):
        return KeyState(key, kind_text, None, None)
    raw = value.encode() if isinstance(value, str) else value
    ttl_ms = int(pttl) if isinstance(pttl, int) and pttl >= 0 else None
    return KeyState(key, kind_text, raw, ttl_ms, _lock_info(key, raw, pttl))


def fence_counter_keys(key: str) -> list[tuple[str, str]]:
    """Where the fence counter of lock ``key`` can be, as ``(label, counter key)`` pairs.

    The core's default counter comes first (:func:`tasklock.core.keys.fence_key_for`); a key laid
    out like a task-layer execution lock (``<prefix>:{<task>}:lock:<digest>``) also gets the
    per-task counter ``<prefix>:{<task>}:fence``. A lock created with an explicit ``fence_key``
    uses a counter that cannot be derived from its name.
    """
    candidates = [("default", fence_key_for(key))]
    match = _TASK_LOCK_KEY.fullmatch(key)
    if match:
        candidates.insert(0, ("task layer", f"{match['base']}:fence"))
    return candidates


def read_fence_counters(client: Any, keys: Sequence[str]) -> dict[str, int | None]:
    """The current value of each counter key (None: not set or not an integer)."""
    if not keys:
        return {}
    with backend_errors(client, "reading fence counters"):
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        answers = pipe.execute(raise_on_error=False)
    result: dict[str, int | None] = {}
    for key, answer in zip(keys, answers, strict=True):
        text = answer.decode() if isinstance(answer, bytes) else answer
        result[key] = int(text) if isinstance(text, str) and text.isdigit() else None
    return result


def release_if_unchanged(client: Any, key: str, value: bytes) -> bool:
    """Delete ``key`` only if it still holds ``value``, and wake its waiters. True if deleted.

    The owner check is the same release script every lock uses, so a lock that expired and was
    taken again since ``value`` was read is left alone.
    """
    with backend_errors(client, f"releasing {key!r}"):
        return bool(RELEASE(client, (key,), (value, wake_channel(key))))
