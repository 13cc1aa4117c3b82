"""tasklock.Lock with the kinds of redis-py client people actually pass it.

Acquire and release take a fast path on stock clients (pre-encoded EVALSHA on the thread's own
connection, see :class:`tasklock.core.scripts.BoundScript` and :mod:`tasklock.core.lanes`) and the
ordinary client call on anything else; both must give the same answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

import tasklock
from tests.support.servers import RedisServer


class TracedRedis(redis.Redis):
    """A client whose execute_command is wrapped (as tracing libraries do): never bypassed."""

    calls: list[Any]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.calls.append(args[0])
        return super().execute_command(*args, **options)


def make_client(kind: str, server: RedisServer) -> redis.Redis:
    host, port = "127.0.0.1", server.port
    if kind == "plain":
        return redis.Redis(host=host, port=port)
    if kind == "decoded":
        return redis.Redis(host=host, port=port, decode_responses=True)
    if kind == "resp3":
        return redis.Redis(host=host, port=port, protocol=3)
    if kind == "resp2":
        return redis.Redis(host=host, port=port, protocol=2)
    if kind == "db3-url":
        return redis.Redis.from_url(f"redis://{host}:{port}/3")
    if kind == "blocking-pool":
        return redis.Redis(
            connection_pool=redis.BlockingConnectionPool(host=host, port=port, max_connections=2)
        )
    if kind == "single-connection":
        return redis.Redis(host=host, port=port, single_connection_client=True)
    if kind == "traced":
        client = TracedRedis(host=host, port=port)
        client.calls = []
        return client
    raise AssertionError(kind)


# RESP3 clients too: the lane's own connections speak RESP2 whatever the pool speaks.
FAST = ["plain", "decoded", "resp3", "resp2", "db3-url", "blocking-pool"]
ORDINARY = ["single-connection", "traced"]


@pytest.fixture(params=FAST + ORDINARY)
def client(
    request: pytest.FixtureRequest, r: redis.Redis, redis_server: RedisServer
) -> Iterator[redis.Redis]:
    made = make_client(request.param, redis_server)
    made.flushdb()
    yield made
    made.close()


def test_full_cycle(client: redis.Redis, request: pytest.FixtureRequest) -> None:
    kind = request.node.callspec.params["client"]
    lock = tasklock.Lock(client, "clients", timeout=10)
    uses_fast_path = lock._acquire_script._lane is not None
    assert uses_fast_path == (kind in FAST)
    assert lock.acquire()
    first = lock.fence
    assert isinstance(first, int)
    assert lock.owned()
    assert lock.locked()
    other = tasklock.Lock(client, "clients", timeout=10)
    assert other.acquire(blocking=False) is False
    assert lock.extend(5)
    lock.release()
    assert not lock.locked()
    assert other.acquire(blocking=False)
    assert other.fence > first
    client.set("clients", "someone-else")
    with pytest.raises(tasklock.LockNotOwnedError):
        other.release()
    if kind == "traced":
        assert isinstance(client, TracedRedis)
        assert client.calls.count("EVALSHA") >= 4, "every script call went through the client"


def test_noscript_on_the_fast_path(client: redis.Redis) -> None:
    lock = tasklock.Lock(client, "flushed", timeout=10)
    client.script_flush()
    assert lock.acquire()
    client.script_flush()
    lock.release()
    layout = lock._layout
    assert client.script_exists(layout.acquire.sha, layout.release.sha) == [False, True]


def test_reassigned_client_is_used(r: redis.Redis, redis_server: RedisServer) -> None:
    """``lock.redis`` is a public attribute in redis-py's Lock; replacing it must take effect."""
    lock = tasklock.Lock(r, "moved", timeout=10)
    other = make_client("db3-url", redis_server)
    lock.redis = other
    assert lock.acquire()
    assert other.exists("moved")
    assert not r.exists("moved")
    lock.release()
    other.close()
