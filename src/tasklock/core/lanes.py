"""A connection per thread for the lock's hot path: acquire and release without the pool.

Why: in redis-py 8 a pooled round trip spends about as much CPU in the pool as in the round trip
itself (a lock, in-use bookkeeping, observability counters, and a ``poll()`` on every checkout for
data a previous user left unread). A lock cycle is two round trips, so the pool was the largest
part of its CPU that was not the round trips themselves. A connection that only one thread uses,
only for tasklock's own scripts, needs none of that: nobody else ever sees it, and redis-py
disconnects a connection whose read was interrupted (a timeout, an exception raised into the
thread), so it never holds a stale reply.

What it costs: one more connection to each server per thread that takes locks there (a Celery
prefork child: one). It is opened from the pool's own settings (host, port, database, credentials,
TLS, timeouts, health checks), reconnects by itself after an error, and is closed when its thread
ends or its pool is garbage-collected; ``client.close()`` does not reach it. A forked child opens
its own; it never writes on its parent's socket. A thread's first few calls borrow from the pool
instead: opening a connection (a TCP handshake and redis-py's greeting) costs more than a few
pooled calls save, and a process that lives for one job (RQ's work horse: acquire, release, done)
never needs one.

A lane's connections speak RESP2, whatever the client's pool speaks (redis-py 8 speaks RESP3 unless
told otherwise). They carry only tasklock's scripts, whose replies tasklock parses itself
(:mod:`tasklock.core.replies`), and a script's reply is the same value in both protocols once
parsed (a Lua ``nil``/``false`` is RESP2's null bulk string and RESP3's ``_``; scripts never switch
to RESP3 with ``redis.setresp``). RESP2 has no push messages, so nothing but the one reply to the
one command can ever arrive; a RESP3 connection could also carry maintenance notifications
(``MOVING``, ``MIGRATING``), meant for the pool's handler, and client-side caching's invalidations.
The pool's own connections keep the client's protocol. Why not parse RESP3 on the lane instead:
measured the same CPU per lock cycle (docs/benchmarks.md), and it would have to route push frames
it does not own; see docs/architecture.md ("The hot path").

Lanes are made for pools whose connections need nothing from the pool after they are made:
redis-py's ``ConnectionPool`` and ``BlockingConnectionPool`` without client-side caching (which
wraps connections in the pool). Every client that is not a stock ``redis.Redis`` (cluster,
single-connection, instrumented) keeps the ordinary path.

A call that was sent is never sent again by tasklock on its own: once the command is written, a
lost connection or a timeout is the first failure of the client's own retry policy (its
``retry``: redis-py's ``Retry``), which decides, as it would in ``execute_command``, whether the
call is tried again (on the lane) or the error is raised. A reply the parser cannot read raises
redis-py's ``InvalidResponse`` and is never retried.

No lanes under gevent or eventlet. Their monkey-patching turns ``threading.local`` into a
greenlet-local, and their Celery pools run every task in a greenlet of its own: a lane per greenlet
is a new connection per task, closed only when the dead greenlet is garbage-collected (a
``-P gevent -c 50`` worker went past 100 connections to the lock's server within 8 bursts of 50
tasks, against 14 to 16 for ``-P threads -c 8``). The alternative, one connection per OS thread
shared by its greenlets, needs a lock around every round trip, because a greenlet yields inside
``read_response`` and another would read its reply; a free list per OS thread avoids that wait, but
is a second pool beside redis-py's, to be kept right for greenlets killed in the middle of a call
(Celery's revoke, a gevent.Timeout). So while ``threading`` is monkey-patched, every pool's calls
take the ordinary path, and the pool keeps at most one connection per greenlet that is inside a
call at once (bounded by the worker's concurrency), reused from task to task. What that costs: a
Celery task's own acquire and release are two calls, inside the warm-up, so they took the pool
before too; a greenlet that takes many locks pays the pool on each (a lock cycle in one greenlet:
about 170 us instead of 110 us on a 2-core VM). Checked when a pool's lane is made, so the hot path
of the thread pools is unchanged, and again before a thread opens its connection: a lane made, but
not yet used, before the patching has a real thread-local, which every greenlet of the thread would
share. A connection opened before the patching is not looked at again: gevent and eventlet require
patching before anything else runs, which Celery's ``-P gevent`` and ``-P eventlet`` do.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse
from redis.exceptions import TimeoutError as RedisTimeoutError

from tasklock.core.replies import INCOMPLETE, parse_reply

__all__ = ["Lane", "encoder_of", "green_threads", "lane_for", "resp2_settings", "round_trip"]

# The stock method, remembered before anything (a tracer, say) could patch it: a client whose
# execute_command differs from it is instrumented, and its calls must go through it.
_STOCK_EXECUTE = redis.Redis.execute_command
_POOL_CLASSES = (redis.ConnectionPool, redis.BlockingConnectionPool)
#: The connections whose socket a lane reads and writes itself (see :func:`round_trip`).
_CONNECTION_CLASSES = (redis.Connection, redis.SSLConnection, redis.UnixDomainSocketConnection)

#: Bumped in a forked child: a connection made before the fork belongs to the parent.
_generation = 0

#: Calls a thread makes through the pool before it gets a connection of its own.
WARM_UP_CALLS = 4

#: How many pre-encoded script calls a lane keeps (see :attr:`Lane.encoded`); past that it
#: starts again empty. Small on purpose: what it saves is a lock made again and again for the
#: same few names (``with Lock(r, name):`` in a loop), while a task's lock has a new name per
#: call's arguments, which a cache only ever misses. Kept for thousands of such names (4,096
#: before), the entries outlived the young generation and the garbage collector scanned them
#: again and again: about 14k instructions per task call, most of it the full collections they
#: brought on, which in a worker's large heap cost far more.
ENCODED_LIMIT = 256


def green_threads() -> bool:
    """True when gevent or eventlet has monkey-patched ``threading``: "threads" are greenlets.

    Asks only a library that is already imported (``sys.modules``), so it never imports gevent or
    eventlet itself. gevent reports the patch on ``threading``, eventlet on ``thread``."""
    gevent_monkey = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None and gevent_monkey.is_module_patched("threading"):
        return True
    patcher = sys.modules.get("eventlet.patcher")
    return patcher is not None and bool(patcher.is_monkey_patched("thread"))


def _after_fork_in_child() -> None:
    global _generation, _lanes_lock
    _generation += 1
    _lanes_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


class Lane:
    """Per-thread connections to one pool's server, and the encoder of the client it serves."""

    __slots__ = ("__weakref__", "_local", "_pool", "encode", "encoded")

    def __init__(self, pool: Any, encode: Any) -> None:
        self._pool = weakref.ref(pool)  # the pool owns its lane, not the other way round
        self._local = threading.local()
        self.encode = encode
        #: The fixed parts of script calls already encoded for this pool, by script, keys and
        #: trailing arguments (see :class:`tasklock.core.scripting.BoundScript`): most programs
        #: make a new lock object per use (``with Lock(r, name):``), and encoding its calls again
        #: cost a fresh object more than a round trip's worth of CPU. Bounded by ENCODED_LIMIT.
        self.encoded: dict[tuple[Any, ...], tuple[bytes, bytes, int]] = {}

    def connection(self) -> Any | None:
        """This thread's connection, or None for one of its first WARM_UP_CALLS calls (in this
        process): the caller then goes through the pool."""
        local = self._local
        if getattr(local, "generation", None) != _generation:
            # New thread, or a forked child: the parent's connection object, if any, is dropped
            # here, and redis-py closes only this process's copy of its socket (no shutdown()
            # from a process that did not open it).
            local.generation = _generation
            local.connection = None
            local.calls = 0
        connection = local.connection
        if connection is None:
            local.calls += 1
            if local.calls <= WARM_UP_CALLS:
                return None
            pool = self._pool()
            if pool is None or green_threads():  # (a pool gone: unreachable while it has a client)
                local.calls = 0  # and checked again after another warm-up, not on every call
                return None
            connection = local.connection = pool.connection_class(
                **resp2_settings(pool.connection_kwargs)
            )
        return connection


#: What a pool's settings hold for RESP3 connections only (maintenance notifications, which are
#: RESP3 push messages, and the pool's handler of them): a lane's RESP2 connection takes none.
_RESP3_ONLY = frozenset(
    {
        "maint_notifications_config",
        "maint_notifications_pool_handler",
        "oss_cluster_maint_notifications_handler",
    }
)


def resp2_settings(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A pool's connection settings (host, credentials, TLS, timeouts, retry policy...) for a
    lane's connection: the same, but speaking RESP2 (see the module docstring)."""
    settings = {key: value for key, value in kwargs.items() if key not in _RESP3_ONLY}
    settings["protocol"] = 2
    return settings


def encoder_of(client: Any) -> Callable[[Any], bytes]:
    """``client``'s encoder, with text and bytes (nearly everything a lock sends: its names,
    tokens and values) taken past its type checks: a task's lock has a new name per call, and
    those checks were most of what encoding its script calls cost. Anything else goes to
    redis-py's own ``encode``, and so is encoded, or refused, as the client would."""
    encoder = client.get_encoder()
    slow: Callable[[Any], bytes] = encoder.encode
    encoding, errors = encoder.encoding, encoder.encoding_errors

    def encode(value: Any) -> bytes:
        kind = type(value)
        if kind is str:
            encoded: bytes = value.encode(encoding, errors)
            return encoded
        if kind is bytes:
            return value  # type: ignore[no-any-return]
        return slow(value)

    return encode


_lanes: weakref.WeakKeyDictionary[Any, Lane | None] = weakref.WeakKeyDictionary()
_lanes_lock = threading.Lock()


def lane_for(client: Any) -> Lane | None:
    """The lane of ``client``'s pool, or None when its calls must take the ordinary path."""
    if not isinstance(client, redis.Redis) or type(client).execute_command is not _STOCK_EXECUTE:
        return None
    if getattr(client, "connection", None) is not None:  # single_connection_client
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
    lane: Lane | None = None
    if (
        type(pool) in _POOL_CLASSES
        and getattr(pool, "connection_class", None) in _CONNECTION_CLASSES
        and getattr(pool, "cache", None) is None
        and not green_threads()
    ):
        lane = Lane(pool, encoder_of(client))
    with _lanes_lock:
        return _lanes.setdefault(pool, lane)


#: How much one read asks for: a lock's reply is a few dozen bytes.
_READ_SIZE = 65536


def round_trip(connection: Any, packed: bytes) -> Any:
    """Send ``packed`` (one command) on a lane's connected ``connection``; read its one reply.

    The socket is redis-py's (connected, authenticated and health-checked by redis-py, on the
    pool's settings), but the bytes are written and the reply parsed here
    (:func:`tasklock.core.replies.parse_reply`): redis-py's per-command layer and its parser cost
    a lock cycle more CPU than the cycle's own work. The rest is as redis-py's
    ``read_response``: an error reply is returned as its exception instance; a timeout, a lost
    connection, a reply that cannot be read (``InvalidResponse``) or anything raised into the
    thread mid-call disconnects (so no stale reply is ever read) and raises as redis-py would.
    """
    if connection.health_check_interval and time.monotonic() > connection.next_health_check:
        connection.check_health()
    sock = connection._sock
    try:
        sock.sendall(packed)
        data = sock.recv(_READ_SIZE)
        reply, after = parse_reply(data, 0)
        if reply is INCOMPLETE:
            buffer = bytearray(data)
            while reply is INCOMPLETE:
                if not data:
                    raise RedisConnectionError("Connection closed by server.")
                data = sock.recv(_READ_SIZE)
                buffer += data
                reply, after = parse_reply(buffer, 0)
            data = bytes(buffer)
        if after != len(data):
            raise InvalidResponse("more than one reply to one command on a tasklock lane")
    except TimeoutError:
        connection.disconnect()
        raise RedisTimeoutError("Timeout reading from the lock's server") from None
    except OSError as exc:
        connection.disconnect()
        raise RedisConnectionError(f"Error while talking to the lock's server: {exc}") from exc
    except BaseException:
        connection.disconnect()
        raise
    if connection.health_check_interval:
        connection.next_health_check = time.monotonic() + connection.health_check_interval
    return reply
