"""Jobs for bench_rq.py: importable by dotted path, as RQ workers need."""

from __future__ import annotations

import socket

from rq import get_current_job

from tasklock.rq import singleton_job


def plain_noop(i: int) -> int:
    return i


def floor_noop(i: int) -> int:
    """A plain job plus two bare round trips on the job's own connection (redis-py PINGs): what
    any execution lock, which takes before the body and releases after it, costs at least
    through that client."""
    job = get_current_job()
    assert job is not None
    job.connection.ping()
    job.connection.ping()
    return i


_held: dict[tuple[str, int], socket.socket] = {}


def socket_floor_noop(i: int) -> int:
    """A plain job plus two bare round trips on a socket held open to the job's Redis, with no
    client library at all: no lock that takes and releases in the worker can beat this job."""
    job = get_current_job()
    assert job is not None
    kwargs = job.connection.connection_pool.connection_kwargs
    address = (kwargs["host"], kwargs["port"])
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
    return i


@singleton_job
def singleton_noop(i: int) -> int:
    return i


@singleton_job(dedupe_enqueue=True)
def dedupe_noop(i: int) -> int:
    return i
