"""Async clients on the suite's module-scoped redis-server (one per test, on the test's loop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from tests.support.servers import RedisServer


@pytest.fixture
async def ar(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url, socket_timeout=5)
    await client.flushall()
    yield client
    await client.aclose()


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> object:
    """uvloop's loop for the tests marked ``uvloop``, asyncio's own for the others
    (pytest-asyncio's hook for loop factories)."""
    if item.get_closest_marker("uvloop") is None:
        return {"asyncio": asyncio.new_event_loop}
    import uvloop

    return {"uvloop": uvloop.new_event_loop}
