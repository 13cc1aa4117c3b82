"""tasklock.asyncio.etcd.Lock against a real single-node etcd (see conftest.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest

from tasklock.asyncio.etcd import AsyncClient, Lock
from tasklock.errors import (
    BackendUnavailable,
    ConfigurationError,
    LockError,
    LockLostError,
    LockNotOwnedError,
)
from tasklock.etcd import Semaphore
from tasklock.etcd.protocol import b64
from tests.integration.etcd.conftest import EtcdServer
from tests.support.servers import free_port


def lock_name() -> str:
    return f"etcd-async-test:{uuid.uuid4().hex[:8]}"


def holder_lease(etcd: EtcdServer, name: str) -> int:
    reply = httpx.post(f"{etcd.url}/v3/kv/range", json={"key": b64(name.encode())}, timeout=5)
    return int(reply.json()["kvs"][0]["lease"])


class CountingClient(AsyncClient):
    """Counts the gateway requests by path, and the watches opened."""

    def __init__(self, endpoints: str) -> None:
        super().__init__(endpoints)
        self.requests: Counter[str] = Counter()
        self.watching = asyncio.Event()
        self.watched: tuple[bytes, bytes | None] | None = None

    async def raw(self, path: str, body: dict[str, Any], what: str) -> tuple[int, bytes, str]:
        self.requests[path] += 1
        return await super().raw(path, body, what)

    async def wait_for_delete(
        self, key: bytes, start_revision: int, timeout: float, *, range_end: bytes | None = None
    ) -> bool:
        self.requests["watch"] += 1
        self.watched = (key, range_end)
        self.watching.set()
        return await super().wait_for_delete(key, start_revision, timeout, range_end=range_end)


async def test_acquire_release_and_context_manager(etcd: EtcdServer) -> None:
    name = lock_name()
    lock = Lock(etcd.url, name, timeout=10)
    assert await lock.acquire(blocking_timeout=5)
    assert await lock.owned()
    assert await lock.locked()
    assert isinstance(lock.fence, int)
    assert lock.fence > 0
    holder, ttl = await lock.peek()
    assert holder is not None
    assert holder.fence == lock.fence
    assert holder.meta["pid"] > 0
    assert ttl is not None
    assert 0 < ttl <= 10
    await lock.release()
    assert not await lock.locked()
    assert lock.fence is None
    url = f"etcd://127.0.0.1:{etcd.client_port}"
    async with Lock(url, name, owner_info={"task": "t-1"}) as held:
        holder, _ = await held.peek()
        assert holder is not None
        assert holder.meta["task"] == "t-1"
    assert not await held.locked()


async def test_a_waiter_watches_and_is_woken_by_the_release(etcd: EtcdServer) -> None:
    name = lock_name()
    holder = Lock(etcd.url, name, timeout=60)  # far longer than the test may take
    assert await holder.acquire()
    client = CountingClient(etcd.url)
    waiter = Lock(client, name, timeout=10, blocking_timeout=30, thread_local=False)
    task = asyncio.create_task(waiter.acquire())
    await asyncio.wait_for(client.watching.wait(), 10)
    await asyncio.sleep(0.2)  # the watch is open and idle: no polling meanwhile
    before = dict(client.requests)
    await holder.release()
    assert await asyncio.wait_for(task, 20), "the waiter was not woken by the release"
    # Two attempts before the watch (the first, and the one after subscribing), one after it;
    # one watch: no polling while the holder held on.
    assert before["/v3/kv/txn"] == 2
    assert client.requests["watch"] == 1
    assert client.requests["/v3/kv/txn"] == 3
    assert client.requests["/v3/kv/range"] == 0
    await waiter.release()  # (thread_local=False: the hold is shared with this task)
    assert client.requests["/v3/kv/txn"] == 3 + 1


async def test_permits_of_a_semaphore_of_the_same_name_keep_it_out(etcd: EtcdServer) -> None:
    """The asyncio lock takes the same steps as the blocking one: a Semaphore's permits hold
    the name, and a waiter watches them (the permit range) until the last one goes."""
    name = lock_name()
    sem = Semaphore(etcd.url, name, 2, timeout=60)
    assert sem.acquire()
    lock = Lock(etcd.url, name, timeout=10)
    assert await lock.acquire(blocking=False) is False
    assert await lock.locked()
    client = CountingClient(etcd.url)
    waiter = Lock(client, name, timeout=10, blocking_timeout=30, thread_local=False)
    task = asyncio.create_task(waiter.acquire())
    await asyncio.wait_for(client.watching.wait(), 10)
    assert client.watched == (f"{name}:permit:".encode(), f"{name}:permit;".encode())
    sem.release()
    assert await asyncio.wait_for(task, 20), "the waiter was not woken by the permit's release"
    assert not sem.acquire(blocking=False)
    await waiter.release()


async def test_non_blocking_and_blocking_timeout(etcd: EtcdServer) -> None:
    name = lock_name()
    async with Lock(etcd.url, name, timeout=30, blocking_timeout=5):
        other = Lock(etcd.url, name, timeout=30)
        assert await other.acquire(blocking=False) is False
        started = asyncio.get_running_loop().time()
        assert await other.acquire(blocking_timeout=0.3) is False
        assert asyncio.get_running_loop().time() - started < 5
        with pytest.raises(LockError):
            async with Lock(etcd.url, name, blocking_timeout=0.1):
                pass
        assert await Lock(etcd.url, name, blocking=False).acquire() is False
    # The failed attempts left no lease holding the key.
    assert await Lock(etcd.url, name, blocking=False).acquire()


async def test_fence_increases_across_holders(etcd: EtcdServer) -> None:
    name = lock_name()
    fences: list[int] = []
    for _ in range(3):
        async with Lock(etcd.url, name, timeout=10, blocking_timeout=5) as lock:
            assert lock.fence is not None
            fences.append(lock.fence)
        async with Lock(etcd.url, lock_name(), timeout=10, blocking_timeout=5) as unrelated:
            assert unrelated.fence is not None
            fences.append(unrelated.fence)
    assert fences == sorted(set(fences)), fences


async def test_release_by_a_holder_that_is_no_longer_the_owner(etcd: EtcdServer) -> None:
    name = lock_name()
    first = Lock(etcd.url, name, timeout=30)
    assert await first.acquire()
    etcd.revoke_lease(holder_lease(etcd, name))  # its lease is gone: the key with it
    second = Lock(etcd.url, name, timeout=30)
    assert await second.acquire(blocking=False)
    assert not await first.owned()
    with pytest.raises(LockNotOwnedError):
        await first.release()
    assert await second.owned()  # the stale release did not delete the new holder's key
    with pytest.raises(LockError):
        await Lock(etcd.url, name).release()  # never acquired
    await second.release()
    quiet = Lock(etcd.url, name, timeout=30, raise_on_release_error=False)
    async with quiet:
        etcd.revoke_lease(holder_lease(etcd, name))
    assert not await quiet.locked()


async def test_extend_keeps_the_fence(etcd: EtcdServer) -> None:
    name = lock_name()
    async with Lock(etcd.url, name, timeout=5) as lock:
        fence = lock.fence
        assert await lock.extend(20)
        _, ttl = await lock.peek()
        assert ttl is not None
        assert ttl > 5
        assert await lock.reacquire()
        _, ttl = await lock.peek()
        assert ttl is not None
        assert ttl <= 5
        assert await lock.owned()
        assert lock.fence == fence


async def test_the_watchdog_keeps_a_short_lease_alive(etcd: EtcdServer) -> None:
    name = lock_name()
    async with Lock(etcd.url, name, timeout=2, watchdog=True) as lock:
        other = Lock(etcd.url, name, timeout=2)
        for _ in range(20):  # 5 s: well past the 2 s lease
            assert await lock.owned()
            assert not await other.acquire(blocking=False)
            await asyncio.sleep(0.25)
        assert not lock.lost


async def test_a_revoked_lease_is_reported_lost(etcd: EtcdServer) -> None:
    name = lock_name()
    called = asyncio.Event()
    lock = Lock(etcd.url, name, timeout=3, watchdog=True, on_lost=lambda _: called.set())
    assert await lock.acquire()
    etcd.revoke_lease(holder_lease(etcd, name))
    await asyncio.wait_for(called.wait(), 10)
    assert lock.lost
    assert lock.lost.reason
    with pytest.raises(LockLostError):
        await lock.release()


async def test_unreachable_endpoints_are_named(etcd: EtcdServer) -> None:
    closed = [free_port(), free_port()]
    lock = Lock(f"etcd://127.0.0.1:{closed[0]},127.0.0.1:{closed[1]}", lock_name())
    with pytest.raises(BackendUnavailable) as caught:
        await lock.acquire()
    for port in closed:
        assert f"127.0.0.1:{port}" in str(caught.value)
    # A closed endpoint before a live one: the request goes on to the live one.
    async with Lock([f"http://127.0.0.1:{closed[0]}", etcd.url], lock_name(), timeout=5) as held:
        assert await held.owned()


async def test_a_cancelled_waiter_leaves_no_key(etcd: EtcdServer) -> None:
    name = lock_name()
    async with Lock(etcd.url, name, timeout=30):
        client = CountingClient(etcd.url)
        waiter = Lock(client, name, timeout=30)
        task = asyncio.create_task(waiter.acquire())
        await asyncio.wait_for(client.watching.wait(), 10)  # waiting: its watch is open
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not await Lock(etcd.url, name).locked()


def test_bad_arguments_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="whole seconds"):
        Lock("etcd://127.0.0.1:2379", "x", timeout=0.5)
    with pytest.raises(ConfigurationError, match="endpoints_or_client"):
        Lock(42, "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="redis://"):
        Lock("redis://127.0.0.1:2379", "x")
