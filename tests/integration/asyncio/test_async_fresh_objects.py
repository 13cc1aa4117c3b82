"""An asyncio lock made per use (``async with tasklock.asyncio.Lock(r, name):``): what it leaves
behind is freed by reference counting alone (see tests/integration/test_fresh_objects.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

import tasklock.asyncio
from tests.support.garbage import cyclic_garbage

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = pytest.mark.usefixtures("resp")


async def test_an_asyncio_lock_made_per_use_is_freed_without_the_garbage_collector(
    ar: aioredis.Redis,
) -> None:
    makers: dict[str, Callable[[], Any]] = {
        "timeout": lambda: tasklock.asyncio.Lock(ar, "afresh:a", timeout=10),
        "watchdog": lambda: tasklock.asyncio.Lock(ar, "afresh:b"),
        "semaphore": lambda: tasklock.asyncio.Semaphore(ar, "afresh:c", 2),
    }
    for label, make in makers.items():
        for _ in range(3):
            async with make():
                pass
        with cyclic_garbage() as found:
            for _ in range(20):
                async with make() as lock:
                    assert lock.fence is not None
                    assert not lock.lost
                await asyncio.sleep(0)
        assert found == [], f"{label}: {sorted(set(found))} were left in reference cycles"
