"""A Semaphore's permits as an operator sees them: listed, read for one name, released one by one.

A :class:`tasklock.Semaphore` keeps its permits in one sorted set at its name (see the PERMIT_*
scripts in :mod:`tasklock.core.scripts`): each member is the value a Lock stores
(``<token> <meta>#<fence>``), its score the permit's expiry in ms on the server's clock. Expired
members stay until the next acquire drops them, so a permit is live only while its score is above
the server's TIME (never the client's clock, which may differ from it), and the key's own TTL says
nothing about any one permit.

Each permit is a :class:`~tasklock.ops.inspect.LockInfo` (``kind`` "permit", ``ttl_ms`` the
permit's own time left, ``permits`` how many its semaphore has live), so ``tasklock ls`` prints
locks and permits as rows of one table. Only members that parse as tasklock values with a fence
(:func:`~tasklock.ops.inspect.parse_lock_value`) count: other libraries' sorted sets (queues,
registries, leaderboards) are not listed, and nothing here writes to them. A read asks for at most
:data:`PERMITS_PER_READ` members of a set, so a large foreign set costs one bounded read; a set
whose first members are permits and that has more is then read whole.

A permit is released with PERMIT_RELEASE, the script a holder's own ``release()`` runs: it drops
only the member it is given (a permit released or expired since it was shown is left alone, and
the other permits are never touched) and wakes the semaphore's waiters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tasklock.core.connection import backend_errors
from tasklock.core.keys import wake_channel
from tasklock.core.scripts import PERMIT_RELEASE
from tasklock.ops.inspect import (
    LockInfo,
    decode_key,
    key_bytes,
    key_text,
    newest_first,
    parse_lock_value,
    scan_pages,
)

__all__ = [
    "PERMITS_PER_READ",
    "find_permit",
    "list_permits",
    "read_permits",
    "release_permit",
    "server_ms",
]

#: Members asked for per sorted set in one read (a semaphore's limit is rarely near this).
PERMITS_PER_READ = 1000


def server_ms(client: Any) -> int:
    """The server's clock in ms, as the permit scripts compute it from TIME."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _read_live(client: Any, keys: Sequence[bytes], now_ms: int, limit: int | None) -> list[Any]:
    """Each key's members scored above ``now_ms``, with their scores, first to expire first: one
    pipelined round trip. An answer is an exception for a key that is no sorted set (no TYPE
    filter on old servers, or it changed)."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        if limit is None:
            pipe.zrangebyscore(key, f"({now_ms}", "+inf", withscores=True)
        else:
            pipe.zrangebyscore(key, f"({now_ms}", "+inf", start=0, num=limit, withscores=True)
    return list(pipe.execute(raise_on_error=False))


def _permits(key: bytes | str, answer: Any, now_ms: int) -> list[LockInfo]:
    """The tasklock permits among one set's live members (ZRANGEBYSCORE WITHSCORES answer)."""
    if not isinstance(answer, list):
        return []
    found: list[tuple[bytes, Any, int | None]] = []
    for member, score in answer:
        if not isinstance(member, bytes | str):
            continue
        holder = parse_lock_value(member)
        if holder is None or holder.fence is None:  # a permit always has its fence
            continue
        raw = member.encode() if isinstance(member, str) else member
        left = float(score) - now_ms
        found.append((raw, holder, max(0, math.ceil(left)) if math.isfinite(left) else None))
    name = decode_key(key)
    return [LockInfo(name, raw, holder, ttl, permits=len(found)) for raw, holder, ttl in found]


def _read_sets(client: Any, keys: Sequence[bytes], now_ms: int) -> list[Any]:
    """:func:`_read_live` of ``keys``, bounded; a set whose bounded read came back full and
    starts with a permit is read again whole (one more round trip, for such sets only)."""
    answers = _read_live(client, keys, now_ms, PERMITS_PER_READ)
    more = [
        i
        for i, answer in enumerate(answers)
        if isinstance(answer, list)
        and len(answer) >= PERMITS_PER_READ
        and _permits(keys[i], answer[:1], now_ms)
    ]
    if more:
        whole = _read_live(client, [keys[i] for i in more], now_ms, None)
        for i, answer in zip(more, whole, strict=True):
            answers[i] = answer
    return answers


def list_permits(client: Any, match: str | bytes = "*") -> list[LockInfo]:
    """Every live permit of every Semaphore whose name matches ``match`` (a SCAN glob), newest
    first (as :func:`~tasklock.ops.inspect.list_locks`).

    SCAN with ``TYPE zset`` where the server supports it; each page's live members are read in
    one pipelined round trip, after one TIME for the page's ``now``.
    """
    permits: dict[tuple[str, bytes], LockInfo] = {}
    with backend_errors(client, f"listing semaphore permits matching {match!r}"):
        for page in scan_pages(client, match, "zset"):
            if not page:
                continue
            now_ms = server_ms(client)
            for key, answer in zip(page, _read_sets(client, page, now_ms), strict=True):
                for info in _permits(key, answer, now_ms):
                    permits[(info.key, info.raw_value)] = info
    return sorted(permits.values(), key=newest_first)


def read_permits(client: Any, key: str) -> list[LockInfo]:
    """The live permits of the Semaphore at ``key`` (``surrogateescape`` form), first to expire
    first; empty when it has none (or ``key`` holds no tasklock permit)."""
    raw_key = key_bytes(key)
    with backend_errors(client, f"reading '{key_text(key)}'"):
        now_ms = server_ms(client)
        [answer] = _read_sets(client, [raw_key], now_ms)
    return _permits(raw_key, answer, now_ms)


def find_permit(
    permits: Sequence[LockInfo], fence: int | None = None, token: str | None = None
) -> LockInfo | None:
    """The permit with this fence, or this owner token (its 32 hex digits), or None."""
    for info in permits:
        if fence is not None and info.fence == fence:
            return info
        if token is not None and info.holder.token == token:
            return info
    return None


def release_permit(client: Any, key: str, value: bytes) -> int:
    """Drop the permit ``value`` of the Semaphore at ``key`` if it is still live, and wake the
    waiters: PERMIT_RELEASE's answer (1 released and waiters told; 2 released, but the server
    refused the PUBLISH, so waiters find it by polling; 0 not live any more, nothing freed)."""
    with backend_errors(client, f"releasing a permit of '{key_text(key)}'"):
        channel = key_bytes(wake_channel(key))
        return int(PERMIT_RELEASE(client, (key_bytes(key),), (value, channel)))
