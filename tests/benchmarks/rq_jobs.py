"""Jobs for bench_rq.py: importable by dotted path, as RQ workers need."""

from __future__ import annotations

from tasklock.rq import singleton_job


def plain_noop(i: int) -> int:
    return i


@singleton_job
def singleton_noop(i: int) -> int:
    return i


@singleton_job(dedupe_enqueue=True)
def dedupe_noop(i: int) -> int:
    return i
