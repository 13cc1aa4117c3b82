"""The per-thread connections of the lock's hot path (:mod:`tasklock.core.lanes`) on a real server.

Each thread gets its own connection after its first few calls (those borrow from the pool), made
from the pool's settings and closed when the thread ends; a forked child never writes on its
parent's socket; a broken connection costs one call on the ordinary path, after which the lane
reconnects.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

import redis

import tasklock
from tasklock.core.lanes import WARM_UP_CALLS, Lane, lane_for
from tasklock.core.scripts import ACQUIRE, EXTEND, RELEASE
from tests.support.forking import ForkedChild
from tests.support.polling import eventually
from tests.support.servers import RedisServer

NAME = "tasklock-lane-test"


def named_connections(admin: redis.Redis) -> int:
    return sum(1 for c in admin.client_list() if c.get("name") == NAME)


def lane_of(client: redis.Redis) -> Lane:
    lane = lane_for(client)
    assert lane is not None, "a stock client on a RESP2 pool has a lane"
    return lane


def warm_up(lock: tasklock.Lock) -> None:
    """Enough lock cycles for this thread's calls to move from the pool to its own connection."""
    for _ in range(WARM_UP_CALLS):
        assert lock.acquire(blocking=False)
        lock.release()


def own_connection(client: redis.Redis) -> Any:
    """This thread's lane connection, if it has one (without counting as a call)."""
    return getattr(lane_of(client)._local, "connection", None)


def test_a_thread_that_takes_one_lock_borrows_from_the_pool(r: redis.Redis) -> None:
    outcome: list[Any] = []

    def once() -> None:
        lock = tasklock.Lock(r, "once", timeout=10)
        assert lock.acquire()
        lock.release()
        outcome.append(own_connection(r))

    thread = threading.Thread(target=once)
    thread.start()
    thread.join(20)
    assert outcome == [None], "acquire + release opened no connection of the thread's own"


def test_each_thread_has_its_own_connection_closed_with_the_thread(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    client = redis_server.client(client_name=NAME)  # the lane copies the pool's settings
    for script in (ACQUIRE, EXTEND, RELEASE):
        r.script_load(script.source)  # no NOSCRIPT fallback through the pool
    threads, ready, leave = 4, threading.Barrier(5), threading.Event()
    seen: dict[int, tuple[int, list[int]]] = {}

    def work(index: int) -> None:
        lock = tasklock.Lock(client, f"lane-{index}", timeout=10)
        warm_up(lock)
        fences = []
        for _ in range(50):
            assert lock.acquire(blocking=False)
            assert lock.fence is not None
            fences.append(lock.fence)
            assert lock.extend(5)  # every script call takes the lane, not only the hot path
            lock.release()
        seen[index] = (id(own_connection(client)), fences)
        ready.wait(20)
        assert leave.wait(20)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    try:
        ready.wait(20)
        assert len({connection for connection, _ in seen.values()}) == threads
        first = WARM_UP_CALLS + 1  # the warm-up cycles took the first fences
        assert all(fences == list(range(first, first + 50)) for _, fences in seen.values())
        pooled = client.connection_pool._created_connections  # by the warm-up calls
        assert named_connections(r) == threads + pooled, "one connection per thread"
    finally:
        leave.set()
        for worker in workers:
            worker.join(20)
    gc.collect()
    eventually(lambda: named_connections(r) == pooled, timeout=10, what="theirs closed")
    client.close()


def test_a_forked_child_never_uses_its_parents_socket(r: redis.Redis) -> None:
    lock = tasklock.Lock(r, "before-fork", timeout=10)
    warm_up(lock)
    assert lock.acquire()
    lock.release()
    parent_connection = own_connection(r)
    parent_socket = parent_connection._sock
    assert parent_socket is not None

    def in_child(report: dict[str, Any]) -> None:
        child_lock = tasklock.Lock(r, "in-child", timeout=10)
        report["cycles"] = 0
        for _ in range(20):
            assert child_lock.acquire(blocking=False)
            child_lock.release()
            report["cycles"] += 1
        child_connection = own_connection(r)
        report["same_object"] = child_connection is parent_connection
        child_connection.send_command("CLIENT", "ID")
        report["client_id"] = int(child_connection.read_response())

    report = ForkedChild(in_child).collect()
    assert report["same_object"] is False
    assert report["cycles"] == 20
    # The parent's connection is the one it had, still open and in step with its replies.
    assert own_connection(r) is parent_connection
    assert parent_connection._sock is parent_socket
    parent_connection.send_command("CLIENT", "ID")
    assert int(parent_connection.read_response()) != report["client_id"]
    assert lock.acquire()
    lock.release()


def test_a_broken_connection_costs_one_ordinary_call(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    lock = tasklock.Lock(client, "across-restart", timeout=10)
    warm_up(lock)
    before = own_connection(client)
    assert before is not None
    redis_server.restart()  # the lane's socket is dead; scripts are gone too (NOSCRIPT)
    assert lock.acquire()  # falls back to the client's own path (retry policy, script load)
    lock.release()
    after = own_connection(client)
    assert after is before, "the lane keeps its connection object and reconnects it"
    assert after._sock is not None, "the next call went through the lane again"
    client.close()
