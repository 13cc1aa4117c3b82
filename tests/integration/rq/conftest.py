"""Fixtures for the RQ tests: a queue on the module's redis-server, fresh guards and counters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from rq import Queue

from tasklock import stats
from tasklock.guard import reset_all
from tests.integration.rq.support import QUEUE


@pytest.fixture(autouse=True)
def fresh_guards(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test resolves options anew (some set TASKLOCK_URL) and counts from zero."""
    for name in ("TASKLOCK_URL", "TASKLOCK_URLS", "TASKLOCK_KEY_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    reset_all()
    stats.reset()
    yield
    reset_all()


@pytest.fixture
def queue(r: redis.Redis) -> Queue:
    return Queue(QUEUE, connection=r)
