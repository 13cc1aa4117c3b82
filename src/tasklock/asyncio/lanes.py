"""Connections of tasklock's own for the asyncio lock's hot path: no pool, no task per call.

Why: a ``redis.asyncio`` round trip through the client spends about as much CPU in the pool
(an ``asyncio.Lock``, in-use bookkeeping, four awaited observability counters and an event
dispatch per checkout and release) and the command layer as in the round trip itself, and a lock
cycle is two round trips. Cancellation safety costs too when done with a shielded task per call
(a task, a future and a callback, each way). So, as the sync lock's lanes do
(:mod:`tasklock.core.lanes`), the lock's scripts go pre-encoded (:class:`AsyncBoundScript`) over
connections of tasklock's own, opened from the pool's own settings and kept in a small stock per
pool: a call takes one (no await when one is idle), writes, and awaits one future, which the
connection's reply reader (:mod:`tasklock.asyncio.replies`) resolves when the reply is in; the
connection goes back to the stock by itself once its last awaited reply has arrived.

Cancellation: the reply of a call whose caller was cancelled (or timed out) still arrives, in
order, and goes to the script's ``on_late`` hook (the acquire releases a lock it took that way)
and to the future ``on_cancel`` was given (a release's outcome). So nothing is ever left
half-read on a connection, and the happy path has no task.

Only stock ``redis.asyncio.Redis`` clients on redis-py's ``ConnectionPool`` or
``BlockingConnectionPool`` without client-side caching get a lane; every other client (cluster,
Sentinel, instrumented) takes the ordinary path (:func:`tasklock.asyncio.scripts.run_script`), and
so does a call the server answered NOSCRIPT (not run: the ordinary path loads the script). As for
the sync lanes, a lane's connections speak RESP2 whatever the pool speaks (see
:mod:`tasklock.core.lanes`), and a call that was written is written again only as the client's
own retry policy allows: a lost connection or a timeout is that policy's first failure. The stock
lives as long as the pool; ``client.aclose()`` does not reach it, and its connections are closed
when the pool is garbage collected.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from time import monotonic
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.exceptions import NoScriptError

from tasklock.asyncio.replies import ReplyReader
from tasklock.asyncio.scripts import run_script
from tasklock.core.connection import describe_client
from tasklock.core.lanes import encoder_of, resp2_settings
from tasklock.core.scripting import Script, _bulk, encoded_parts

__all__ = ["AsyncBoundScript", "AsyncLane", "LaneConnection", "async_lane_for"]

log = logging.getLogger("tasklock.lock")

_STOCK_EXECUTE = aioredis.Redis.execute_command
_POOL_CLASSES = (aioredis.ConnectionPool, aioredis.BlockingConnectionPool)
#: Idle connections kept per pool (more are closed).
MAX_IDLE = 16


class LaneConnection:
    """A connection redis-py opened (TLS, HELLO, AUTH, SELECT), whose transport tasklock then
    reads itself (:class:`~tasklock.asyncio.replies.ReplyReader`): commands are written with
    :meth:`write`, and each reply goes to the callback given to ``reader.expect``, in order. A
    connection taken from its lane goes back to it by itself once its last reply is in."""

    __slots__ = ("_timer", "_writer", "checked_out", "deadline", "lane", "reader", "transport")

    def __init__(self, lane: AsyncLane, connection: Any) -> None:
        self.lane = lane
        self.checked_out = True
        #: When the reply now awaited must have come (by time.monotonic), or None (see
        #: :meth:`answer_within`); ``_timer`` is the one timer that checks it.
        self.deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        writer, stream = connection._writer, connection._reader
        # Kept: asyncio's StreamWriter closes its transport when it is garbage collected.
        self._writer = writer
        self.transport = writer.transport
        self.reader = ReplyReader(lane.where)
        leftover = bytes(getattr(stream, "_buffer", b"") or b"")
        self.transport.set_protocol(self.reader)
        # tasklock owns the transport now: redis-py's object must not close or warn about it.
        connection._writer = connection._reader = None
        if leftover:
            self.reader.feed(leftover)
        self.reader.on_idle = self._idle

    @property
    def usable(self) -> bool:
        return self.reader.lost is None and not self.transport.is_closing()

    def write(self, data: bytes) -> None:
        if not self.usable:
            raise redis_errors.ConnectionError(f"the connection to {self.lane.where} is closed")
        self.transport.write(data)

    def answer_within(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        """The reply now awaited must come within ``seconds``, or the connection is closed and
        its waiting callbacks get a TimeoutError (as redis-py's own read timeout would do).

        One timer per connection, not one per call: it is armed when none is, and when it fires
        it only looks at the deadline of the reply awaited then (re-armed for that one, if it
        is not yet due). ``asyncio.timeout`` per call (a Timeout, a timer in the loop's heap,
        the task's cancel bookkeeping, each way) cost a lock cycle more CPU than its two
        replies' parsing and delivery together."""
        # By time.monotonic (one C call; the loop's own clock may differ, as uvloop's does: it
        # is used only to set the timer, which is rare).
        self.deadline = monotonic() + seconds
        if self._timer is None:
            self._timer = loop.call_later(seconds, self._check_deadline, loop)

    def _check_deadline(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        deadline = self.deadline
        if deadline is None or not self.reader.waiting:
            return  # idle since: the next call arms the timer again
        left = deadline - monotonic()
        if left > 0:
            self._timer = loop.call_later(left, self._check_deadline, loop)
            return
        self.reader.fail(redis_errors.TimeoutError(f"Timeout reading from {self.lane.where}"))
        self.close()

    def _idle(self, _reader: ReplyReader) -> None:
        self.deadline = None
        if self.checked_out:
            self.lane.put(self)

    def close(self) -> None:
        self.checked_out = False
        timer, self._timer = self._timer, None
        with contextlib.suppress(Exception):  # (its loop closed: it goes with the collector)
            if timer is not None:
                timer.cancel()
            self.transport.abort()


class AsyncLane:
    """tasklock's own connections to one pool's server, and the encoder of its client."""

    __slots__ = (
        "__weakref__",
        "_idle",
        "_kwargs",
        "_make",
        "encode",
        "encoded",
        "encoding",
        "failing",
        "retry",
        "timeout",
        "where",
    )

    def __init__(self, pool: Any, encode: Callable[[Any], bytes], where: str) -> None:
        kwargs = pool.connection_kwargs
        #: Lanes with equal encodings encode a command to the same bytes (the fan-out packs a
        #: command once for all masters).
        self.encoding = (kwargs.get("encoding"), kwargs.get("encoding_errors"))
        #: The client's socket timeout, for a single call's reply (None: wait).
        self.timeout: float | None = kwargs.get("socket_timeout")
        self.where = where
        self._make = pool.connection_class
        # RESP2, whatever the pool speaks, and without the pool's maintenance-notification
        # handler (RESP3 push messages; it also refers to the pool, which owns this lane).
        self._kwargs = resp2_settings(kwargs)
        #: The retry policy of the pool's connections (set when the first connection is made):
        #: it alone decides whether a call that was written is written again.
        self.retry: Any = None
        self._idle: collections.deque[LaneConnection] = collections.deque()
        self.encode = encode
        #: The fixed parts of script calls already encoded (see
        #: :attr:`tasklock.core.lanes.Lane.encoded`).
        self.encoded: dict[tuple[Any, ...], tuple[bytes, bytes, int]] = {}
        #: Set when a connect failed or a round found the server silent, cleared by its next
        #: reply: a Redlock round then gives it no connect allowance (it is likely down).
        self.failing = False

    def take_idle(self) -> LaneConnection | None:
        """An idle connection, or None (no await: a caller then connects, or a task does)."""
        while self._idle:
            connection = self._idle.pop()
            if connection.usable:
                connection.checked_out = True
                return connection
            connection.close()
        return None

    async def connect(self) -> LaneConnection:
        """A new connection, taken (it goes back to the stock after its first exchange)."""
        connection = self._make(**self._kwargs)
        await connection.connect()
        self.retry = connection.retry
        return LaneConnection(self, connection)

    def put(self, connection: LaneConnection) -> None:
        connection.checked_out = False
        if connection.usable and len(self._idle) < MAX_IDLE:
            self._idle.append(connection)
        else:
            connection.close()

    def close_all(self) -> None:
        while self._idle:
            self._idle.pop().close()


async def _retried(retry: Any, error: Exception, exchange: Callable[[], Awaitable[Any]]) -> Any:
    """The rest of the client's retry policy (``retry``: its connections' ``Retry``) for a call
    whose first attempt failed after it was written: ``error`` is that policy's first failure,
    and each further attempt is ``exchange()`` on the lane, as redis-py's ``execute_command``
    would make it on a pooled connection (see :func:`tasklock.core.scripting._retried`). A lost
    connection is closed already: nothing to do on a failure but count it."""
    first: list[Exception] = [error]

    async def attempt() -> Any:
        if first:
            raise first.pop()
        answer = await exchange()
        if isinstance(answer, redis_errors.ConnectionError | redis_errors.TimeoutError):
            raise answer
        return answer

    async def failed(_error: Exception) -> None:
        return None

    return await retry.call_with_retry(attempt, failed)


def _resolve(future: asyncio.Future[Any], reply: Any) -> None:
    if future.done():
        return
    if isinstance(reply, BaseException):
        future.set_exception(reply)
    else:
        future.set_result(reply)


_lanes: weakref.WeakKeyDictionary[Any, AsyncLane | None] = weakref.WeakKeyDictionary()


def async_lane_for(client: Any) -> AsyncLane | None:
    """The lane of ``client``'s pool, or None when its calls must take the ordinary path."""
    if (
        not isinstance(client, aioredis.Redis)
        or type(client).execute_command is not _STOCK_EXECUTE
        or getattr(client, "single_connection_client", False)
    ):
        return None
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return None
    try:
        return _lanes[pool]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable
        return None
    lane: AsyncLane | None = None
    if type(pool) in _POOL_CLASSES and getattr(pool, "cache", None) is None:
        lane = AsyncLane(pool, encoder_of(client), describe_client(client))
        weakref.finalize(pool, lane.close_all)
    return _lanes.setdefault(pool, lane)


class AsyncBoundScript:
    """A script with fixed keys (and fixed trailing arguments) on one ``redis.asyncio`` client,
    sent pre-encoded on its lane (see the module docstring); the answer and the errors are those
    of :func:`run_script`. A call's ``on_late`` gets its reply if its caller was cancelled (per
    call, not kept here: the lock that owns this would otherwise be in a reference cycle)."""

    __slots__ = (
        "_argc",
        "_head",
        "_lane",
        "_tail",
        "client",
        "fast",
        "keys",
        "script",
        "tail",
    )

    def __init__(
        self,
        script: Script,
        client: Any,
        keys: Sequence[Any],
        tail: Sequence[Any] = (),
    ) -> None:
        self.script = script
        self.client = client
        self.keys = tuple(keys)
        self.tail = tuple(tail)
        self._lane = lane = async_lane_for(client)
        #: True when calls go over the lane (and so deal with their caller's cancellation).
        self.fast = lane is not None
        if lane is not None:
            self._head, self._tail, self._argc = encoded_parts(lane, script, self.keys, self.tail)

    async def __call__(
        self,
        *args: Any,
        on_cancel: Callable[[asyncio.Future[Any]], None] | None = None,
        on_late: Callable[[Any, tuple[Any, ...]], None] | None = None,
    ) -> Any:
        """The script's answer. If the caller is cancelled while the reply is on its way, the
        reply still arrives: ``on_late`` gets it, and ``on_cancel`` a future of it."""
        lane = self._lane
        if lane is not None:
            packed = b"*%d\r\n%s%s%s" % (
                self._argc + len(args),
                self._head,
                _bulk(map(lane.encode, args)),
                self._tail,
            )
            answer = await self._exchange(lane, packed, args, on_cancel, on_late)
            if isinstance(answer, redis_errors.ConnectionError | redis_errors.TimeoutError):
                # Sent, so it may have run: only the client's retry policy may send it again.
                again = functools.partial(self._exchange, lane, packed, args, on_cancel, on_late)
                answer = await _retried(lane.retry, answer, again)
            if not isinstance(answer, NoScriptError):
                if isinstance(answer, BaseException):
                    raise answer
                return answer
            # NOSCRIPT: not run; the ordinary way loads the script
        return await run_script(self.client, self.script, self.keys, (*args, *self.tail))

    async def _exchange(
        self,
        lane: AsyncLane,
        packed: bytes,
        args: tuple[Any, ...],
        on_cancel: Callable[[asyncio.Future[Any]], None] | None,
        on_late: Callable[[Any, tuple[Any, ...]], None] | None,
    ) -> Any:
        """One attempt on the lane: the reply, or the error instance the server or the
        connection gave (a server's error, a lost connection, a timeout), returned, not raised;
        only a failed connect and a cancellation raise."""
        connection = lane.take_idle()  # (usable, and nothing is awaited before the write)
        if connection is None:
            connection = await lane.connect()
            if not connection.usable:  # lost while it was being set up
                connection.close()
                return redis_errors.ConnectionError(f"the connection to {lane.where} was lost")
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[Any] = loop.create_future()
        late: list[asyncio.Future[Any]] = []
        delivered: list[Any] = []  # a late reply that came before the cancellation's handler

        def deliver(reply: Any) -> None:
            if not answered.done():
                answered.set_result(reply)
            else:  # the caller left (cancelled, or timed out): the reply is a late one
                handle_late(reply)

        def handle_late(reply: Any) -> None:
            delivered.append(reply)
            for future in late:
                _resolve(future, reply)
            if on_late is not None and not isinstance(reply, BaseException):
                try:
                    on_late(reply, args)
                except Exception:
                    log.exception("handling the late reply of a %s call", self.script.name)

        connection.transport.write(packed)
        connection.reader.expect(deliver)
        if lane.timeout is not None:  # (a reply past it: a TimeoutError, returned)
            connection.answer_within(loop, lane.timeout)
        try:
            return await answered
        except asyncio.CancelledError:
            if on_cancel is not None:
                future = loop.create_future()
                if delivered:  # the late reply is already in
                    _resolve(future, delivered[0])
                else:
                    late.append(future)
                on_cancel(future)
            if answered.done() and not answered.cancelled():
                # The reply came in before the cancellation was delivered: late all the
                # same (an acquire that took the lock must release it).
                handle_late(answered.result())
            raise
