"""Jobs for bench_rq.py: importable by dotted path, as RQ workers need."""

from __future__ import annotations

from rq import get_current_job

from tasklock.rq import singleton_job
from tests.benchmarks.floors import two_socket_pings


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


def socket_floor_noop(i: int) -> int:
    """A plain job plus two bare round trips on a socket held open to the job's Redis, with no
    client library at all: no lock that takes and releases in the worker can beat this job."""
    job = get_current_job()
    assert job is not None
    two_socket_pings(job.connection.connection_pool.connection_kwargs)
    return i


@singleton_job
def singleton_noop(i: int) -> int:
    return i


@singleton_job(dedupe_enqueue=True)
def dedupe_noop(i: int) -> int:
    return i
