"""Small pieces over sockets and threads for the fan-out: which idle connections are dead, one
``poll()`` over many sockets, a wake-up pair, and the daemon workers that run blocking connects.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import select
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = [
    "MAX_WORKERS",
    "Poller",
    "Waker",
    "Workers",
    "readable_now",
    "run_in_background",
    "socket_of",
    "stale_connections",
    "workers",
]

#: Worker threads for connects, at most (they are created on demand and reused).
MAX_WORKERS = 64


def socket_of(conn: Any) -> socket.socket | None:
    sock = getattr(conn, "_sock", None)
    if sock is None and hasattr(conn, "_conn"):  # redis-py's client-side-caching proxy
        sock = getattr(conn._conn, "_sock", None)
    return sock


def stale_connections(conns: list[Any]) -> set[int]:
    """Positions of idle connections whose socket is readable (dead): one ``select`` for all."""
    socks = [socket_of(conn) for conn in conns]
    try:
        ready, _, _ = select.select([s for s in socks if s is not None], [], [], 0)
    except (OSError, ValueError):  # a closed socket, or beyond select's descriptor limit
        return {i for i, s in enumerate(socks) if s is None or readable_now(s)}
    dead = set(ready)
    return {i for i, s in enumerate(socks) if s is None or s in dead}


def readable_now(sock: socket.socket) -> bool:
    """True if ``sock`` has data or EOF waiting: for an idle connection that means it is dead."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


class Poller:
    """``poll()`` where available (no descriptor limit), ``select()`` elsewhere."""

    def __init__(self) -> None:
        self._poll = select.poll() if hasattr(select, "poll") else None
        self._fds: set[int] = set()

    def register(self, fd: int) -> None:
        self._fds.add(fd)
        if self._poll is not None:
            self._poll.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)

    def unregister(self, fd: int) -> None:
        if fd in self._fds:
            self._fds.discard(fd)
            if self._poll is not None:
                self._poll.unregister(fd)

    def __bool__(self) -> bool:
        return bool(self._fds)

    def poll(self, timeout: float | None) -> list[int]:
        if self._poll is not None:
            ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
            return [fd for fd, _ in self._poll.poll(ms)]
        ready, _, _ = select.select(list(self._fds), [], [], timeout)
        return list(ready)


class Waker:
    """A socket pair that a worker thread writes to, to wake a caller waiting in ``poll()``."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self.fd = self._r.fileno()

    def wake(self, *_: object) -> None:
        with contextlib.suppress(OSError):  # full (already woken) or closed (caller left)
            self._w.send(b"x")

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            while self._r.recv(512):
                pass

    def close(self) -> None:
        self._r.close()
        self._w.close()


class Workers:
    """Daemon threads, created on demand and reused, that run blocking connects.

    Daemon threads, not a ThreadPoolExecutor: a connect stuck on a paused server (a client without
    socket timeouts waits forever) must never hold up interpreter exit.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._queued = 0

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            self._queued += 1
            self._queue.put((future, fn))
            if self._queued > self._idle and self._threads < self._limit:
                self._threads += 1
                threading.Thread(target=self._run, name="tasklock-connect", daemon=True).start()
        return future

    def _run(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            future, fn = self._queue.get()
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)


_workers_lock = threading.Lock()
_worker_pool: Workers | None = None


def workers() -> Workers:
    """The process's connect workers (created on first use; a forked child gets new ones)."""
    global _worker_pool
    if _worker_pool is None:
        with _workers_lock:
            if _worker_pool is None:
                _worker_pool = Workers(MAX_WORKERS)
    return _worker_pool


def run_in_background(fn: Callable[[], Any]) -> Future[Any]:
    """Run a blocking call (e.g. a subscribe) on the fan-out's daemon workers."""
    return workers().submit(fn)


def _reset_after_fork() -> None:
    global _workers_lock, _worker_pool
    _workers_lock = threading.Lock()
    _worker_pool = None


os.register_at_fork(after_in_child=_reset_after_fork)
