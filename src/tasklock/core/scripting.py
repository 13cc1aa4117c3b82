"""How tasklock sends a Lua script: EVALSHA by SHA1, a load and a retry on NOSCRIPT, the packed hot
path on a thread's own connection, and pipelined batches.

The scripts themselves are in :mod:`tasklock.core.scripts`. A server that answers NOSCRIPT (new
server, restart, SCRIPT FLUSH) gets ``SCRIPT LOAD`` once and the call is repeated. Nothing is
cached globally per client: the SHA is a pure function of the source, and which server has loaded
what is the server's business, so one Lock class works with any number of clients (redis-py
caches its Script objects on the class, bound to the first client).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis.exceptions as redis_errors
from redis.exceptions import NoScriptError

from tasklock.core.lanes import ENCODED_LIMIT, Lane, lane_for, round_trip

__all__ = ["BoundScript", "EncodingLane", "Script", "encoded_parts", "run_batch"]


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)
    #: ``EVALSHA <sha>`` as RESP bulk strings, the start of every packed call (see BoundScript).
    packed_head: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        sha = hashlib.sha1(self.source.encode()).hexdigest()
        object.__setattr__(self, "sha", sha)
        object.__setattr__(self, "packed_head", _bulk([b"EVALSHA", sha.encode()]))

    def __call__(self, client: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run on ``client`` (a redis-py client): one EVALSHA, and a load + retry on NOSCRIPT.

        Sent on the thread's own connection when the client has a lane (see BoundScript),
        else (and after NOSCRIPT there) through the client itself."""
        lane = lane_for(client)
        connection = lane.connection() if lane is not None else None
        if lane is not None and connection is not None:
            encode = lane.encode
            parts = [b"%d" % len(keys), *map(encode, keys), *map(encode, args)]
            packed = b"*%d\r\n%s%s" % (2 + len(parts), self.packed_head, _bulk(parts))
            answer = _send(connection, packed)
            if answer is not _MISSED:
                return answer
        return self.ordinary(client, keys, args)

    def ordinary(self, client: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """The call through the client's own ``execute_command`` (its retry policy applies)."""
        try:
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.execute_command("SCRIPT", "LOAD", self.source)
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)

    def queue(self, pipe: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Queue on a pipeline; the caller handles NOSCRIPT results (see :func:`run_batch`)."""
        pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)

    def bind(self, client: Any, keys: Sequence[Any], tail: Sequence[Any] = ()) -> BoundScript:
        """This script with fixed ``keys`` and fixed trailing arguments on one client."""
        return BoundScript(self, client, keys, tail)


def _bulk(parts: Iterable[bytes]) -> bytes:
    # (A list, not a generator: join builds one anyway, and the generator's frame switches cost
    # a fresh lock's calls more than the encoding itself.)
    return b"".join([b"$%d\r\n%s\r\n" % (len(part), part) for part in parts])


_MISSED: Any = object()


def _send(connection: Any, packed: bytes) -> Any:
    """Send one packed call on a lane's connection; its answer, or _MISSED when the server did
    not run it (NOSCRIPT) and it must go the ordinary way, which loads the script."""
    # A connect failure is raised as the client would raise it: its connect() has already been
    # through the retry policy, and nothing was sent.
    if connection._sock is None:
        connection.connect()
    try:
        answer = round_trip(connection, packed)
    except (redis_errors.ConnectionError, redis_errors.TimeoutError) as error:
        # Sent, so it may have run: only the client's retry policy may send it again.
        answer = _retried(connection, packed, error)
    if isinstance(answer, NoScriptError):
        return _MISSED
    if isinstance(answer, redis_errors.ResponseError):
        raise answer
    return answer


def _retried(connection: Any, packed: bytes, error: Exception) -> Any:
    """The rest of the client's retry policy (the connection's ``retry``, from the pool's
    settings) for a call whose first attempt failed after it was sent: ``error`` counts as that
    policy's first failure, and each further attempt is made on the lane, exactly as redis-py's
    ``execute_command`` would make it on its pooled connection. With no retries (redis-py's
    ``from_url`` default) the error is raised; a call is never sent more times than the policy
    allows. (``round_trip`` has already disconnected the connection that failed.)"""
    first: list[Exception] = [error]

    def attempt() -> Any:
        if first:
            raise first.pop()
        if connection._sock is None:
            connection.connect()
        return round_trip(connection, packed)

    return connection.retry.call_with_retry(attempt, lambda _error: connection.disconnect())


class BoundScript:
    """A script with fixed keys (and fixed trailing arguments) on one client: the lock's hot path.

    The EVALSHA is encoded once, with the client's own encoder, except for the per-call
    arguments, and sent on this thread's own connection to the client's server once it has one
    (see :mod:`tasklock.core.lanes`; until then, the ordinary way). That skips redis-py's
    per-command layer and its pool, and nothing else: the answer and the errors are the same as
    :meth:`Script.__call__`'s. A connection-level error after the send is the first failure of
    the client's own retry policy, which alone decides whether it is sent again (see
    :func:`_retried`); NOSCRIPT (not run) sends it the ordinary way, which loads the script; a
    connection that cannot be made at all is an error at once, as it is for the client. Clients
    it cannot vouch for always take the ordinary way.
    """

    __slots__ = ("_argc", "_head", "_lane", "_tail", "client", "keys", "script", "tail")

    def __init__(
        self,
        script: Script,
        client: Any,
        keys: Sequence[Any],
        tail: Sequence[Any] = (),
        *,
        lane: Lane | bool | None = True,
        known: dict[Any, bytes] | None = None,
    ) -> None:
        """``lane``: the client's lane when the caller has looked it up already (True: look it
        up); ``known``: keys encoded for another call of the same lock (:func:`encoded_parts`)."""
        self.script = script
        self.client = client
        self.keys = tuple(keys)
        self.tail = tuple(tail)
        self._lane = lane = lane_for(client) if lane is True else lane or None
        if lane is not None:
            self._head, self._tail, self._argc = encoded_parts(
                lane, script, self.keys, self.tail, known
            )

    def __call__(self, *args: Any) -> Any:
        lane = self._lane
        connection = lane.connection() if lane is not None else None
        if lane is not None and connection is not None:
            encode = lane.encode
            packed = b"*%d\r\n%s%s%s" % (
                self._argc + len(args),
                self._head,
                _bulk(map(encode, args)),
                self._tail,
            )
            answer = _send(connection, packed)
            if answer is not _MISSED:
                return answer
        return self.script.ordinary(self.client, self.keys, (*args, *self.tail))


class EncodingLane(Protocol):
    """What :func:`encoded_parts` needs of a lane, blocking or asyncio."""

    encode: Callable[[Any], bytes]
    encoded: dict[tuple[Any, ...], tuple[bytes, bytes, int]]


def _bulk_keys(
    keys: tuple[Any, ...], encode: Callable[[Any], bytes], known: dict[Any, bytes]
) -> bytes:
    """The key count and the keys as RESP bulk strings; ``known``: keys already encoded (a
    lock's acquire and release share most of theirs), added to as it goes."""
    count = b"%d" % len(keys)
    parts = [b"$%d\r\n%s\r\n" % (len(count), count)]
    for key in keys:
        bulk = known.get(key)
        if bulk is None:
            encoded = encode(key)
            bulk = known[key] = b"$%d\r\n%s\r\n" % (len(encoded), encoded)
        parts.append(bulk)
    return b"".join(parts)


def encoded_parts(
    lane: EncodingLane,
    script: Script,
    keys: tuple[Any, ...],
    tail: tuple[Any, ...],
    known: dict[Any, bytes] | None = None,
) -> tuple[bytes, bytes, int]:
    """The fixed parts of a bound call (the head through the keys, the trailing arguments, and
    the count of fixed words), encoded once per lane (see :attr:`Lane.encoded`). ``known``: keys
    encoded for another call of the same lock (see :func:`_bulk_keys`)."""
    memo = lane.encoded
    cache_key = (script.sha, keys, tail)
    parts = memo.get(cache_key)
    if parts is None:
        encode = lane.encode
        # The trailing arguments (a TTL, a limit) are the same for every name of one lock's
        # options: kept apart, under ("tail", tail), so a new name encodes only its keys.
        # A tail that starts with text starts with a wake channel, new with each name (a
        # release's): not kept apart. One that starts with a number (an acquire's TTLs, limit)
        # is the same for every name of one lock's options.
        if tail and type(tail[0]) is int:
            tail_key = ("tail", tail)
            encoded_tail = memo.get(tail_key)
            if encoded_tail is None:
                encoded_tail = memo[tail_key] = (b"", _bulk(map(encode, tail)), len(tail))
            tail_bytes = encoded_tail[1]
        else:
            tail_bytes = _bulk(map(encode, tail))
        head = script.packed_head + _bulk_keys(keys, encode, {} if known is None else known)
        parts = (head, tail_bytes, 3 + len(keys) + len(tail))
        if len(memo) >= ENCODED_LIMIT:
            memo.clear()
        memo[cache_key] = parts
    return parts


def run_batch(
    client: Any, calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]]
) -> list[Any]:
    """Run many script calls in one pipelined round trip (no MULTI).

    Results come back in order; an error for one call is returned in its place (not raised) so one
    bad key cannot hide the others' results. NOSCRIPT results are retried once after loading.
    A connection error is raised: the whole batch did not get an answer.
    """
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        script.queue(pipe, keys, args)
    results: list[Any] = list(pipe.execute(raise_on_error=False))
    missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
    if missing:
        for script in {calls[i][0] for i in missing}:
            client.execute_command("SCRIPT", "LOAD", script.source)
        retry = client.pipeline(transaction=False)
        for i in missing:
            script, keys, args = calls[i]
            script.queue(retry, keys, args)
        for i, result in zip(missing, retry.execute(raise_on_error=False), strict=True):
            results[i] = result
    return results
