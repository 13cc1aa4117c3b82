"""The per-thread connections of the lock's hot path (:mod:`tasklock.core.lanes`) on a real server.

Each thread gets its own connection after its first few calls (those borrow from the pool), made
from the pool's settings and closed when the thread ends; a forked child never writes on its
parent's socket; a broken connection costs one call on the ordinary path, after which the lane
reconnects.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import redis

import tasklock
from tasklock.core.lanes import WARM_UP_CALLS, Lane, lane_for
from tasklock.core.queue_scripts import FAIR_ACQUIRE, FAIR_RELEASE
from tasklock.core.scripts import EXTEND
from tests.support.forking import ForkedChild
from tests.support.polling import eventually
from tests.support.servers import RedisServer

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = pytest.mark.usefixtures("resp")

NAME = "tasklock-lane-test"
ROOT = Path(__file__).resolve().parents[2]


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
    for script in (FAIR_ACQUIRE, EXTEND, FAIR_RELEASE):
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
        # One fence per acquisition, strictly increasing
        assert all(fences == sorted(set(fences)) for _, fences in seen.values())
        assert all(len(fences) == 50 for _, fences in seen.values())
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


# -- gevent and eventlet -------------------------------------------------------------------------

# Run by a fresh interpreter (monkey-patching cannot be undone): rounds of greenlets, each taking
# more script calls than a thread's warm-up, on one client; prints what the server saw as JSON.
GREEN_PROCESS = """
import json, sys
library, port, name, early = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "early"
report = {}
if early:  # a lane made (not used) before the patching, as by a module imported too soon
    import redis
    from tasklock.core.lanes import lane_for
    client = redis.Redis(port=port, client_name=name)
    report["lane_before_patching"] = lane_for(client) is not None
if library == "gevent":
    from gevent import monkey
    monkey.patch_all()
    import gevent
    def run_all(bodies):
        gevent.joinall([gevent.spawn(body) for body in bodies], raise_error=True)
else:
    import eventlet
    eventlet.monkey_patch()
    def run_all(bodies):
        pool = eventlet.GreenPool(len(bodies))
        for thread in [pool.spawn(body) for body in bodies]:
            thread.wait()
import redis
import tasklock
from tasklock.core.lanes import WARM_UP_CALLS, green_threads, lane_for
if not early:
    client = redis.Redis(port=port, client_name=name)
admin = redis.Redis(port=port)
def connections():
    return sum(1 for c in admin.client_list() if c.get("name") == name)
def opened():
    return int(admin.info("stats")["total_connections_received"])
def body(round_, index):
    def run():
        for step in range(WARM_UP_CALLS):  # two calls each: acquire and release
            with tasklock.Lock(client, f"green:{round_}:{index}:{step}", timeout=10):
                pass
    return run
report["green_threads"] = green_threads()
report["lane"] = lane_for(client) is not None
report["live"], report["opened"] = [], []
for round_ in range(int(sys.argv[5])):
    run_all([body(round_, index) for index in range(int(sys.argv[6]))])
    report["live"].append(connections())
    report["opened"].append(opened())
print(json.dumps(report))
"""


def run_green(
    library: str, redis_server: RedisServer, *, early: bool = False, rounds: int, greenlets: int
) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", GREEN_PROCESS, library, str(redis_server.port), NAME,
         "early" if early else "late", str(rounds), str(greenlets)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("library", ["gevent", "eventlet"])
def test_greenlets_share_the_pool_instead_of_a_connection_each(
    r: redis.Redis, redis_server: RedisServer, library: str
) -> None:
    """Under monkey-patching a "thread" is a greenlet, one per task in Celery's gevent and
    eventlet pools: a lane each would be a new connection per task, closed only by the garbage
    collector. Without lanes the pool's connections are reused from round to round."""
    greenlets, rounds = 25, 5
    report = run_green(library, redis_server, rounds=rounds, greenlets=greenlets)
    assert report["green_threads"] is True
    assert report["lane"] is False
    assert max(report["live"]) <= greenlets, f"at most one per greenlet at once: {report}"
    # After the first round, the pool's connections are reused: a lane per greenlet would open
    # `greenlets` more every round.
    assert report["opened"][-1] - report["opened"][0] < greenlets, report


@pytest.mark.timeout(120)
def test_a_lane_made_before_the_patching_opens_no_connection_after_it(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    """Its thread-local is a real one: every greenlet of the thread would share one connection
    and read each other's replies. The check before opening a connection keeps them on the pool."""
    greenlets, rounds = 10, 2
    report = run_green("gevent", redis_server, early=True, rounds=rounds, greenlets=greenlets)
    assert report["lane_before_patching"] is True
    assert report["lane"] is True, "the lane made before the patching stays cached"
    assert max(report["live"]) <= greenlets, report
    assert report["opened"][-1] - report["opened"][0] < greenlets, report
