"""The socket floor of the task benchmarks: two bare round trips to Redis on a socket held open,
with no client library at all (what no lock that takes before a body and releases after it can
beat). Shared by ``bench_celery.py`` and ``rq_jobs.py``."""

from __future__ import annotations

import socket
from typing import Any

_held: dict[tuple[str, int], socket.socket] = {}


def two_socket_pings(connection_kwargs: dict[str, Any]) -> None:
    """Two PINGs, each waited for, on this process's socket to the server that a redis-py
    pool's ``connection_kwargs`` name (opened on first use and kept)."""
    address = (connection_kwargs["host"], connection_kwargs["port"])
    sock = _held.get(address)
    if sock is None:
        sock = _held[address] = socket.create_connection(address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(2):
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        reply = b""
        while len(reply) < 7:  # +PONG\r\n
            chunk = sock.recv(7 - len(reply))
            if not chunk:
                raise ConnectionError("redis-server closed the benchmark's socket")
            reply += chunk
