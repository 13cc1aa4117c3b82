"""A TCP proxy on loopback in front of one server: real latency, partitions and resets.

SIGSTOP freezes a server for every client at once. A network fault is one client's view: the
server goes on answering others while this client's bytes are late (``latency``), or go nowhere
(``partition``: the connections stay open and nothing arrives, as when packets are dropped; TCP
would retransmit them, so what was held is delivered on ``heal``), or its connections break
(``reset``). Clients connect to ``proxy.port`` instead of the server's.

One thread moves every connection's bytes (a selector loop); each chunk read is due ``latency``
seconds after it arrived, in order, in both directions.
"""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import struct
import threading
import time
from typing import Any

__all__ = ["TcpProxy"]


class _Direction:
    """Bytes read from ``source``, due for ``sink`` at their time."""

    __slots__ = ("pending", "sink", "source")

    def __init__(self, source: socket.socket, sink: socket.socket) -> None:
        self.source = source
        self.sink = sink
        self.pending: collections.deque[tuple[float, bytes]] = collections.deque()


class TcpProxy:
    """Forward 127.0.0.1:``port`` to ``target_host``:``target_port``; a context manager."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        #: Seconds each chunk is held before it is passed on (each way).
        self.latency = 0.0
        self._partitioned = False
        self._lock = threading.Lock()
        self._directions: list[_Direction] = []
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()

    # -- faults ------------------------------------------------------------------------------
    def partition(self) -> None:
        """Deliver nothing either way (connections stay open; new ones connect but hear
        nothing) until :meth:`heal`."""
        with self._lock:
            self._partitioned = True
        self._wake()

    def heal(self) -> None:
        """End a partition: what was held is delivered, late, in order."""
        with self._lock:
            self._partitioned = False
        self._wake()

    def reset(self) -> None:
        """Break every connection made so far (the client sees its connection closed)."""
        with self._lock:
            directions, self._directions = self._directions, []
        for direction in directions:
            for sock in (direction.source, direction.sink):
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
                with contextlib.suppress(OSError):  # an RST, not an orderly close
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()

    def connections(self) -> int:
        """Client connections open through the proxy."""
        with self._lock:
            return len(self._directions) // 2

    def close(self) -> None:
        self._closed = True
        self._wake()
        self._thread.join(5)
        self.reset()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        self._selector.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ----------------------------------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            server = socket.create_connection(self._target, timeout=5)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        client.setblocking(True)  # read only when the selector says so: recv never blocks
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        up, down = _Direction(client, server), _Direction(server, client)
        with self._lock:
            self._directions += [up, down]
        self._selector.register(client, selectors.EVENT_READ, up)
        self._selector.register(server, selectors.EVENT_READ, down)

    def _drop(self, direction: _Direction) -> None:
        """One side closed: close both (the other side sees the close)."""
        with self._lock:
            pair = [d for d in self._directions if d.source in (direction.source, direction.sink)]
            self._directions = [d for d in self._directions if d not in pair]
        for sock in (direction.source, direction.sink):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            sock.close()

    def _run(self) -> None:
        while not self._closed:
            now = time.monotonic()
            with self._lock:
                partitioned = self._partitioned
                directions = list(self._directions)
            due: float | None = None
            if not partitioned:
                for direction in directions:
                    while direction.pending and direction.pending[0][0] <= now:
                        _, data = direction.pending.popleft()
                        try:
                            direction.sink.sendall(data)
                        except OSError:
                            direction.pending.clear()
                            break
                    if direction.pending:
                        first = direction.pending[0][0]
                        due = first if due is None else min(due, first)
            timeout = None if due is None else max(0.0, due - time.monotonic())
            for key, _ in self._selector.select(timeout):
                if key.data == "wake":
                    self._wake_r.recv(4096)
                elif key.data is None:
                    self._accept()
                else:
                    self._read(key.data, key.fileobj)

    def _read(self, direction: Any, sock: Any) -> None:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(direction)
            return
        direction.pending.append((time.monotonic() + self.latency, data))
