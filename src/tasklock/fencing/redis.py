"""Fencing when Redis is the store: the token check and the write in one Lua script.

::

    from tasklock.fencing.redis import fenced_set

    with tasklock.Lock(r, "lock:report:42") as lock:
        payload = build_report(42)
        fenced_set(r, "report:42", payload, lock.fence)   # StaleFence if a newer hold wrote

A lock alone cannot stop a holder that paused (GC, swap, a stopped VM) past its TTL from writing
after the next holder has: only the store can, by refusing the older token. Here the store is
Redis, and its "transaction" is one script: it reads the newest token that wrote ``key``, refuses
an older one (:class:`tasklock.StaleFence`, nothing written), and otherwise writes the value and
the token together. A read in Python followed by a SET would let the next holder's write land
between the two.

Where the token is kept: beside the value, in the fence key :func:`fence_key` gives,
``{key}:fence`` (or ``key:fence`` when ``key`` already has a ``{tag}``). The script touches both
keys, so on Redis Cluster they must share a hash slot: wrapping the whole key in braces makes
Redis hash exactly the text of the key, so ``{report:42}:fence`` lands in ``report:42``'s slot, and
a key with its own tag keeps it. A key with a ``}`` but no valid tag (``a}b``, ``x{}``) cannot be
wrapped; on a cluster client that is a ConfigurationError asking for a hash tag (on a single
Redis it does not matter). A key with a tag also keeps its fence key under its own prefix
(``app:{report:42}`` -> ``app:{report:42}:fence``), which a cleanup by prefix (``SCAN MATCH
app:*``) finds; an untagged key's fence key starts with ``{``. ``key`` is the data's key, not the
lock's name: the lock's own key holds the lock.

Expiry (``ex=`` seconds / ``px=`` ms): the value and its fence key get the same expiry, set in the
same script, the fence key last, so it never expires before the value (were it to, a stale writer
would find no token and overwrite a newer value). A write without expiry makes both persistent,
as a plain SET does. Once both have expired the resource starts over: the first write is accepted
whatever its token. That is the choice: a value that has expired holds nothing newer to protect,
and a fence that outlived every value would leave one key behind per key ever written. If a
stale writer must never re-create an expired value, write it without an expiry.

Delete with :func:`fenced_delete`, not DEL: it refuses an older token the same way, and leaves the
fence key behind with the deleting token (a tombstone, keeping the fence key's expiry, that is
the deleted value's), so a stale writer cannot bring the value back.

An ACL user needs ``+evalsha +script|load +type +get +set +del`` on ``~<key>`` and its fence key.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from redis.crc import key_slot

from tasklock.core.connection import backend_errors
from tasklock.core.keys import fence_key_for
from tasklock.core.scripting import Script
from tasklock.errors import ConfigurationError, StaleFence
from tasklock.fencing.rules import check_token

__all__ = ["FENCED_WRITE", "fence_key", "fenced_delete", "fenced_set"]

#: The longest expiry accepted, in ms: far beyond any use, and short of what would overflow the
#: server's clock + expiry.
MAX_EXPIRY_MS = 2**62

# KEYS[1] the protected value (a string), KEYS[2] its fence key: the newest token accepted for it
# ARGV[1] the writer's fence token (decimal, no leading zeros), ARGV[2] "set" or "del",
# ARGV[3] "set": the expiry of both keys in ms ("0": none, both persist); "del": unused,
# ARGV[4] "set": the value
# Returns {1, n} when accepted (n: 1 for a set; for a del, the number of keys deleted, 0 or 1),
# {0, stored} when refused because the stored token is newer (nothing written), {-1, stored} when
# the fence key holds something that is not a token, {-2, i, type} when KEYS[i] holds a type other
# than a string (nothing written: SET would silently replace a hash or a list).
# Tokens are compared as decimal text (longer is larger, then by character), not as Lua numbers,
# which are doubles and lose precision above 2^53; equal is accepted (the same hold writing twice).
# "set" writes the value first and the fence key last, with the same PX, so the fence key's expiry
# is never before the value's (also on servers that read the clock anew for each command). "del"
# deletes the value and keeps the fence key as a tombstone with the token (KEEPTTL: the expiry
# the deleted value had, none if it had none).
#: The script behind :func:`fenced_set` and :func:`fenced_delete` (one round trip each).
FENCED_WRITE = Script(
    "fenced_write",
    """
for i = 1, 2 do
  local kind = redis.call('TYPE', KEYS[i]).ok
  if kind ~= 'string' and kind ~= 'none' then
    return {-2, i, kind}
  end
end
local token = ARGV[1]
local stored = redis.call('GET', KEYS[2])
if stored then
  if not string.match(stored, '^%d+$') then
    return {-1, string.sub(stored, 1, 40)}
  end
  stored = string.match(stored, '^0*(%d-%d)$')
  if #stored > #token or (#stored == #token and stored > token) then
    return {0, stored}
  end
end
if ARGV[2] == 'del' then
  local deleted = redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], token, 'KEEPTTL')
  return {1, deleted}
end
if ARGV[3] == '0' then
  redis.call('SET', KEYS[1], ARGV[4])
  redis.call('SET', KEYS[2], token)
else
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[3])
  redis.call('SET', KEYS[2], token, 'PX', ARGV[3])
end
return {1, 1}
""",
)


def fence_key(key: str) -> str:
    """The key that keeps the newest token that wrote ``key``: ``{key}:fence``, or ``key:fence``
    when ``key`` has a hash tag; in ``key``'s Redis Cluster slot either way (see the module)."""
    return fence_key_for(_check_key(key))


def fenced_set(
    client: Any,
    key: str,
    value: str | bytes | int | float,
    token: int | None,
    *,
    ex: float | datetime.timedelta | None = None,
    px: int | datetime.timedelta | None = None,
) -> None:
    """SET ``key`` to ``value`` unless a newer token than ``token`` has written it.

    ``token`` is the lock hold's fence (``lock.fence``, ``fence_token=`` in a task); None (a lock
    without a fence) is a ConfigurationError, never an unchecked write. Accepted when ``key`` has
    no token yet or one not newer (equal: the same hold writing again); the value and the token
    are then written together, in one script. Refused: :class:`tasklock.StaleFence` (``resource``
    is ``key``, ``newer`` the stored token), and nothing is written.

    ``ex`` (seconds) or ``px`` (milliseconds): the expiry of the value and of its fence key alike
    (none: both persist); see the module for why the two expire together.

    Raises ConfigurationError for a None or non-int token, a bad key, value or expiry, or a key
    (or its fence key) holding something other than a string; :class:`tasklock.BackendUnavailable`
    when Redis does not answer.
    """
    key = _check_key(key)
    token = check_token(token, key)
    if isinstance(value, bool) or not isinstance(value, str | bytes | int | float):
        raise ConfigurationError(
            f"fenced_set({key!r}): the value must be str, bytes, int or float (what Redis stores "
            f"as a string), got {type(value).__name__}: serialise it first (json.dumps, ...)"
        )
    ms = _expiry_ms(key, ex, px)
    _write(client, key, token, "set", [ms, value])


def fenced_delete(client: Any, key: str, token: int | None) -> bool:
    """DEL ``key`` unless a newer token than ``token`` has written it: True when a value was
    deleted, False when there was none. Refused: :class:`tasklock.StaleFence`, nothing deleted.

    The fence key stays, holding ``token`` and keeping its expiry (the deleted value's), so a
    stale writer cannot re-create the value: a deletion is a write like any other. Errors as
    :func:`fenced_set`.
    """
    key = _check_key(key)
    token = check_token(token, key)
    return bool(_write(client, key, token, "del", [0]))


def _write(client: Any, key: str, token: int, mode: str, args: list[Any]) -> int:
    """Run the script; its count on acceptance, else the error its answer means."""
    fence = fence_key_for(key)
    _check_slots(client, key, fence)
    keys = [key, fence]
    doing = f"writing {key!r} fenced by token {token}"
    with backend_errors(client, doing, keys):
        reply = FENCED_WRITE(client, keys, [token, mode, *args])
    status = int(reply[0])
    if status == 1:
        return int(reply[1])
    if status == 0:
        raise StaleFence(resource=key, token=token, newer=int(reply[1]))
    if status == -1:
        raise ConfigurationError(
            f"fenced write of {key!r}: its fence key {fence!r} holds {_text(reply[1])!r}, not a "
            "fence token: something else writes that key. Keep the fence key for tasklock (it is "
            "{key}:fence, or key:fence for a key with a {tag})"
        )
    which = keys[int(reply[1]) - 1]
    role = "the fenced value" if which == key else "its fence token"
    raise ConfigurationError(
        f"fenced write of {key!r}: the key {which!r} holds a {_text(reply[2])}, not a string "
        f"({role}); nothing was written. Fence a key of its own: a fenced write replaces the "
        "value, and would destroy what is there"
    )


def _text(raw: Any) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def _check_key(key: Any) -> str:
    # Not rules.check_resource: its 255-character limit is the fence table's column, and a Redis
    # key has none.
    if not isinstance(key, str) or not key:
        raise ConfigurationError(
            f"key must be a non-empty string naming the value to write (e.g. 'report:42'), got "
            f"{key!r}"
        )
    return key


def _check_slots(client: Any, key: str, fence: str) -> None:
    """On a cluster client, a ConfigurationError when ``key`` and its fence key hash to different
    slots (a key with a stray ``}``): redis-py would refuse the script with a bare exception."""
    if getattr(client, "nodes_manager", None) is None:  # not redis.cluster.RedisCluster
        return
    encode = client.get_encoder().encode
    if key_slot(encode(key)) != key_slot(encode(fence)):
        raise ConfigurationError(
            f"fenced write of {key!r} on Redis Cluster: the key has a '}}' but no hash tag, so "
            f"its fence key {fence!r} hashes to another slot and one script cannot write both. "
            "Name the key without a stray '}', or give it a hash tag (e.g. '{acct-42}:report')"
        )


def _expiry_ms(key: str, ex: Any, px: Any) -> int:
    """``ex`` (seconds) or ``px`` (ms) in whole ms, at least 1; 0 for no expiry."""
    if ex is not None and px is not None:
        raise ConfigurationError(
            f"fenced_set({key!r}): give ex= (seconds) or px= (milliseconds), not both"
        )
    if ex is None and px is None:
        return 0
    option, value = ("ex", ex) if ex is not None else ("px", px)
    if isinstance(value, datetime.timedelta):
        ms = value.total_seconds() * 1000
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"fenced_set({key!r}): {option}= must be a number of "
            f"{'seconds' if option == 'ex' else 'milliseconds'} or a timedelta, got {value!r}"
        )
    elif option == "px" and not isinstance(value, int):
        raise ConfigurationError(
            f"fenced_set({key!r}): px= must be a whole number of milliseconds, got {value!r} "
            "(ex= takes fractions of a second)"
        )
    else:
        ms = value * 1000 if option == "ex" else value
    if not math.isfinite(ms) or ms <= 0 or ms > MAX_EXPIRY_MS:
        raise ConfigurationError(
            f"fenced_set({key!r}): {option}= must be a finite expiry above 0 (None: no expiry), "
            f"got {value!r}"
        )
    return max(1, round(ms))
