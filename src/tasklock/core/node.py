"""One Redis server as the fan-out sees it: a stock of connected connections, its health, and the
releases it could not be sent yet.

The fan-out (:mod:`tasklock.core.fanout`) writes on connections it takes from here and hands them
back when their replies are in (or the reaper, :mod:`tasklock.core.reaper`, does, for replies
nobody waited for). This module knows nothing of either: they depend on it, never the other way.

Threads are used here only where redis-py can only block:

* Connecting (TCP plus redis-py's handshake: HELLO/AUTH/SELECT/CLIENT SETINFO) runs on a small
  pool of daemon worker threads, reused across calls; the caller waits for it no longer than its
  deadline. A worker only connects, it never sends a command, so a connection that comes up late
  can never deliver a stale command. A node whose last call failed gets one connect attempt at a
  time, so a paused server pins at most one worker whatever the call rate, and the pool cannot be
  starved by stuck connects.
* Releases that could not be written because the server had no connection are deferred and sent
  by a background job on a connection of its own, tried again after a pause while the server
  stays away.

Connections are made from each client's own connection class and settings (host, password, TLS,
database...), but owned here, outside the client's pool, and kept in a small stock per server. They
connect with redis-py's own retries turned off: a caller that gets no verdict retries by itself,
and redis-py 8's default (10 retries with backoff up to 1 s) would keep a restarted server unusable
for seconds. A stocked connection whose socket became readable (the server closed it or restarted)
is dropped before use. Everything is fork-safe: a child starts with no stock and no workers.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from concurrent.futures import Future
from typing import Any

from redis.backoff import NoBackoff
from redis.exceptions import ResponseError
from redis.retry import Retry

from tasklock.core import clock as _clock
from tasklock.core.connection import describe_client
from tasklock.core.ops import Op
from tasklock.core.sockets import Waker, readable_now, socket_of, workers

__all__ = ["Node", "node_for"]

#: Idle connections kept per server (more are closed).
MAX_IDLE = 16
#: Connects in flight at once to a server that answers; a failing one gets a single one.
MAX_CONNECTING = 4
#: Deferred releases kept per server, at most (the oldest are dropped: their keys expire).
MAX_DEFERRED = 10_000
#: How soon deferred commands are sent again to a server that was away when they were last
#: tried, doubling up to the second figure while it stays away (see :meth:`Node._drain`).
DEFER_RETRY_FIRST, DEFER_RETRY_MAX = 0.25, 4.0


class Node:
    """One Redis server as the fan-out sees it: a stock of connected connections, health, label.

    One per client object in a process (see :func:`node_for`), shared by every lock over it, so
    the watchdog can batch all of a server's renewals into one round trip.
    """

    def __init__(self, client: Any) -> None:
        pool = client.connection_pool
        self._connection_class = pool.connection_class
        self._connection_kwargs = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
        self.label = describe_client(client)
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._connects: list[Future[Any]] = []
        #: Monotonic time of the first failure in the current run of failures, or None.
        self.failing_since: float | None = None
        self._deferred: list[Op] = []
        self._draining = False
        self._retry_in = 0.0  # the pause before the next try of a server that was away
        self._listeners: set[Waker] = set()  # calls waiting for a connection to this server
        #: Per-deadline views of this server shaped like a redis-py client, made and cached by
        #: :func:`tasklock.core.fanout.timed` (kept here so they live exactly as long as the node).
        self.views: dict[float, Any] = {}
        _every_node.add(self)

    def __repr__(self) -> str:
        return f"<Node {self.label}>"

    def _forget_after_fork(self) -> None:
        # Locks made before the fork keep their Node objects; the sockets stay the parent's.
        self._lock = threading.Lock()
        self._idle = []
        self._connects = []
        self._deferred = []
        self._draining = False
        self._retry_in = 0.0
        self._listeners = set()
        self.failing_since = None

    # connections
    def take(self, checked: bool = True) -> Any | None:
        """An idle, connected connection, or None (then call :meth:`connecting`).

        ``checked``: drop connections whose socket turned readable while idle (the server
        closed them: restarted, killed, timeout). A caller taking several connections passes
        False and checks them all with one ``select``
        (:func:`tasklock.core.sockets.stale_connections`).
        """
        if self._deferred and not self._draining:
            self._drain_soon()
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn = self._idle.pop()
            sock = socket_of(conn)
            if sock is not None and not (checked and readable_now(sock)):
                return conn
            self.discard(conn)

    def defer(self, op: Op) -> None:
        """Send ``op`` to this server later: for an owner-checked release that could not be
        written because the server had no connection (paused, restarting). Only commands that
        are harmless however late belong here; a SET never does."""
        with self._lock:
            self._deferred.append(op)
            del self._deferred[:-MAX_DEFERRED]
        self._drain_soon()

    def _drain_soon(self) -> None:
        """Start the background job that sends the deferred commands (one per server)."""
        with self._lock:
            if self._draining or not self._deferred:
                return
            self._draining = True
        workers().submit(self._drain)

    def _drain(self) -> None:
        """Send the deferred commands on a connection of its own (never one a caller waits
        for) and read their answers. If the server is still away (or too slow to answer in
        its socket timeout), they stay queued and are tried again after a pause, doubling up to
        DEFER_RETRY_MAX, and at the next call to this server (see :meth:`take`). Waiting for a
        next call only, a release deferred by the last call a process made to a server stayed
        there until the key's TTL: nothing else would ever call it."""
        away = False
        try:
            while True:
                with self._lock:
                    ops, self._deferred = self._deferred, []
                if not ops:
                    return
                conn = self._connection_class(**self._connection_kwargs)
                try:
                    conn.connect()
                    conn.send_packed_command(
                        conn.pack_commands([op.self_contained() for op in ops]),
                        check_health=False,
                    )
                    for _ in ops:
                        with contextlib.suppress(ResponseError):
                            conn.read_response()
                except Exception:
                    with self._lock:
                        self._deferred[:0] = ops
                        del self._deferred[:-MAX_DEFERRED]
                    away = True
                    return
                finally:
                    self.discard(conn)
        finally:
            with self._lock:
                self._draining = False
                self._retry_in = min(DEFER_RETRY_MAX, self._retry_in * 2 or DEFER_RETRY_FIRST)
                if not away:
                    self._retry_in = 0.0
                pause = self._retry_in
            if away:
                retry = threading.Timer(pause, self._drain_soon)
                retry.daemon = True
                retry.start()
            elif self._deferred:  # queued just as this job found nothing left
                self._drain_soon()

    def put(self, conn: Any) -> None:
        """Return a connection with no reply outstanding (waking calls that wait for one)."""
        if socket_of(conn) is not None:
            with self._lock:
                if len(self._idle) < MAX_IDLE:
                    self._idle.append(conn)
                    listeners = list(self._listeners)
                    conn = None
            if conn is None:
                for waker in listeners:
                    waker.wake()
                return
        self.discard(conn)

    def listen(self, waker: Waker) -> None:
        """Wake ``waker`` whenever a connection to this server becomes idle."""
        with self._lock:
            self._listeners.add(waker)

    def unlisten(self, waker: Waker) -> None:
        with self._lock:
            self._listeners.discard(waker)

    @staticmethod
    def discard(conn: Any) -> None:
        """Close a connection that cannot be reused (dead, or a reply is still outstanding)."""
        with contextlib.suppress(Exception):
            conn.disconnect()

    def connecting(self) -> Future[Any]:
        """A background connect that stocks a new connection when done (or one already running)."""
        with self._lock:
            self._connects = [f for f in self._connects if not f.done()]
            limit = 1 if self.failing_since is not None else MAX_CONNECTING
            if len(self._connects) >= limit:
                return self._connects[0]
            future = workers().submit(self._connect)
            self._connects.append(future)
            return future

    def _connect(self) -> None:
        conn = self._connection_class(**self._connection_kwargs)
        try:
            conn.connect()
        except BaseException:
            self.discard(conn)
            self.mark_failed()
            raise
        self.mark_ok()
        self.put(conn)
        if self._deferred:
            self._drain_soon()

    # health
    def mark_ok(self) -> None:
        self.failing_since = None

    def mark_failed(self) -> None:
        if self.failing_since is None:
            self.failing_since = _clock.clock.monotonic()


# -- process-wide state (fork-safe) -------------------------------------------------------------
_state_lock = threading.Lock()
_nodes: weakref.WeakKeyDictionary[Any, Node] = weakref.WeakKeyDictionary()
_every_node: weakref.WeakSet[Node] = weakref.WeakSet()


def node_for(client: Any) -> Node:
    """The process's :class:`Node` for a redis-py client (one per client object)."""
    with _state_lock:
        node = _nodes.get(client)
        if node is None:
            node = _nodes[client] = Node(client)
        return node


def _reset_after_fork() -> None:
    # Dropped, not closed: the sockets belong to the parent, which keeps using them.
    global _state_lock, _nodes
    _state_lock = threading.Lock()
    _nodes = weakref.WeakKeyDictionary()
    for node in list(_every_node):
        node._forget_after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)
