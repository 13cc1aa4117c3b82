"""Redlock under concurrency and CPU load (issue 26): many threads (blocking) or tasks (asyncio)
on a few names over five real masters, with cold connection pools and two CPU-burning processes
on the machine's cores, all with the default deadlines.

What must hold: no blocking acquire raises QuorumNotReached (a round without a verdict is retried
until ``blocking_timeout``; connecting a cold pool is not a master's silence), and no master holds
any of the names shortly after the last release (a failed or abandoned round leaves no key).
Nothing here asserts a duration: the load only makes the slow paths happen.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

import tasklock
import tasklock.asyncio
from tests.support.polling import async_eventually, eventually
from tests.support.servers import RedisServer

pytestmark = pytest.mark.timeout(120)

WORKERS = 10
NAMES = 3
CYCLES = 4
TTL = 30  # a key left behind outlives the test: only a release or an undo deletes it in time
WAIT = 60  # blocking_timeout: far beyond what the cycles need, even on a loaded machine
CLEANUP = 5.0  # well below the TTL


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Two processes that burn a core each for as long as the test runs."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def names() -> list[str]:
    return [f"load-{i}" for i in range(NAMES)]


def keys_left(nodes: list[RedisServer]) -> list[tuple[int, bytes, int]]:
    """(master, name, pttl ms) of every lock key still held."""
    left = []
    for index, server in enumerate(nodes):
        client = server.client()
        try:
            for name in names():
                if client.exists(name):
                    left.append((index, name.encode(), int(client.pttl(name))))
        finally:
            client.close()
    return left


def no_key_left(nodes: list[RedisServer]) -> None:
    try:
        eventually(lambda: not keys_left(nodes), timeout=CLEANUP, what="every key released")
    except AssertionError:
        pytest.fail(f"keys left after the last release (master, name, pttl ms): {keys_left(nodes)}")


def test_blocking_redlock_under_load_never_gives_up_early_and_leaves_no_key(
    nodes: list[RedisServer], cpu_load: None
) -> None:
    clients = [redis.Redis.from_url(server.url) for server in nodes]  # cold pools
    failures: list[BaseException] = []
    start = threading.Barrier(WORKERS)

    def work(index: int) -> None:
        name = names()[index % NAMES]
        start.wait()
        for _ in range(CYCLES):
            lock = tasklock.Redlock(clients, name, timeout=TTL, blocking_timeout=WAIT)
            try:
                assert lock.acquire()
                lock.release()
            except BaseException as exc:
                failures.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    no_key_left(nodes)


def test_asyncio_redlock_under_load_never_gives_up_early_and_leaves_no_key(
    nodes: list[RedisServer], cpu_load: None
) -> None:
    failures: list[BaseException] = []

    async def scenario() -> None:
        clients: list[Any] = [aioredis.Redis.from_url(server.url) for server in nodes]

        async def work(index: int) -> None:
            name = names()[index % NAMES]
            for _ in range(CYCLES):
                lock = tasklock.asyncio.Redlock(clients, name, timeout=TTL, blocking_timeout=WAIT)
                try:
                    assert await lock.acquire()
                    await lock.release()
                except BaseException as exc:
                    failures.append(exc)

        # Every task starts at once on cold pools: the first round needs a connection per task
        # and master, made on this one event loop.
        await asyncio.gather(*(work(i) for i in range(WORKERS)))
        try:
            # The loop keeps running while late releases and undos are sent and answered.
            await async_eventually(lambda: not keys_left(nodes), "released", timeout=CLEANUP)
        except AssertionError:
            pytest.fail(f"keys left after the last release (master, name, pttl ms): "
                        f"{keys_left(nodes)}")  # fmt: skip
        finally:
            for client in clients:
                await client.aclose()

    asyncio.run(scenario())
    assert failures == []
