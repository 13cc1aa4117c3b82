"""SingletonTask under each of Celery's execution pools, in real ``celery worker`` subprocesses:
``-P threads``, ``-P gevent``, ``-P eventlet`` and ``-P solo`` (prefork: ``test_prefork.py``).

Each test runs on the pools where they differ, not on every pool: greenlet pools are where
connections and the watchdog behave differently (a "thread" is a greenlet, one per task, and
nothing runs while a body does not yield); ``solo`` runs one body at a time in the worker's main
thread, so it only has the watchdog to prove. One worker per pool serves the whole module (pytest
groups the tests by the module-scoped ``worker`` parameter), with a broker server and a separate
lock server, whose connections are all tasklock's: the lock URL names them with a client name.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.integration.celery import pool_app
from tests.integration.celery.support import WorkerProcess
from tests.support.history import (
    FencedRegister,
    HistoryLog,
    assert_fences_increase,
    assert_no_overlap,
)
from tests.support.polling import eventually, holds_for
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

app = pool_app.app
CLIENT_NAME = "tl-pool-worker"
#: The issue's figure for the greenlet pools; modest for real threads on a 2-core machine.
CONCURRENCY = {"threads": 8, "gevent": 50, "eventlet": 50, "solo": 1}
GREEN = ("gevent", "eventlet")


@dataclass
class PoolWorker:
    pool: str
    concurrency: int
    process: WorkerProcess
    directory: Path
    locks: redis.Redis  # the test's own client to the lock server
    broker: redis.Redis  # and to the broker's (never flushed: kombu keeps its bindings there)

    def log(self) -> str:
        return self.process.log()

    def connections(self) -> int:
        """Connections the worker has open to the lock server (all of them are tasklock's)."""
        return sum(1 for c in self.locks.client_list() if c.get("name") == CLIENT_NAME)

    def opened(self) -> int:
        """Connections the lock server has accepted so far, from anyone."""
        return int(self.locks.info("stats")["total_connections_received"])


@pytest.fixture(scope="module")
def lock_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def worker(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    lock_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PoolWorker]:
    pool: str = request.param
    directory = tmp_path_factory.mktemp(f"pool-{pool}")
    env = {"TL_POOL_URL": redis_server.url, "TL_POOL_DIR": str(directory),
           "TL_POOL_LOCK_URL": f"{lock_server.url}?client_name={CLIENT_NAME}"}  # fmt: skip
    app.conf.update(broker_url=redis_server.url, result_backend=redis_server.url)
    process = WorkerProcess(
        "tests.integration.celery.pool_app", env, directory / "worker.log",
        pool=pool, concurrency=CONCURRENCY[pool],
    )  # fmt: skip
    locks, broker = lock_server.client(), redis_server.client()
    try:
        process.start(app)
        yield PoolWorker(pool, CONCURRENCY[pool], process, directory, locks, broker)
    finally:
        process.stop()
        locks.close()
        broker.close()


def pools(*names: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("worker", names, indirect=True)


@pools("threads", "gevent", "eventlet")
def test_lock_connections_do_not_grow_with_bursts(worker: PoolWorker) -> None:
    """Bursts of distinct singleton calls, each taking a few locks of its own inside (more script
    calls than a thread's warm-up): the lock server's connections stay within the pool's
    concurrency, and after the first bursts no new ones are opened. A lane per greenlet used to
    open a connection per task under gevent and eventlet, closed only by the garbage collector."""
    bursts, c = 8, worker.concurrency
    # Under threads: one lane per thread, and the client's pool; under greenlets: the pool only.
    bound = (2 if worker.pool == "threads" else 1) * c + 4  # + the wake-up listener, renewals
    run = uuid.uuid4().hex[:8]
    live, opened = [], []
    for burst in range(bursts):
        calls = [pool_app.burst.delay(f"{run}:{burst}", item) for item in range(c)]
        for call in calls:
            call.get(timeout=60)
        live.append(worker.connections())
        opened.append(worker.opened())
    figures = f"{worker.pool} -c {c}: live after each burst {live}, accepted so far {opened}"
    assert max(live) <= bound, figures
    # From the third burst on the connections made by the first ones are reused: fewer new ones
    # than one burst's tasks (a connection per task would be c per burst).
    assert opened[-1] - opened[1] < c, figures


@pools("threads", "gevent", "eventlet")
def test_concurrent_duplicates_never_overlap(worker: PoolWorker) -> None:
    """Ten calls per account at once, on_duplicate="wait": they run one after another (recorded
    history), with increasing fences, every fenced write accepted."""
    run = uuid.uuid4().int % 10**9
    accounts = (run, run + 1)
    calls = [pool_app.exclusive.delay(account, call) for account in accounts for call in range(10)]
    fences = [call.get(timeout=60) for call in calls]
    names = {f"exclusive:{account}" for account in accounts}
    holds = [h for h in HistoryLog(worker.directory / "history.log").holds() if h.name in names]
    assert len(holds) == 20
    assert_no_overlap(holds)
    assert_fences_increase(holds)
    assert len(set(fences)) == 20
    register = FencedRegister(worker.directory / "register.db")
    register.assert_consistent()
    assert all(w["accepted"] for w in register.writes() if w["name"] in names)


@pools("threads", "gevent", "eventlet", "solo")
def test_watchdog_keeps_a_yielding_body_past_its_ttl(worker: PoolWorker) -> None:
    """ttl=1 and a body that sleeps (a yield under gevent and eventlet) until the test lets it go:
    the same hold stays for more than three TTLs, renewed by the watchdog (a thread, or a
    greenlet)."""
    tag = uuid.uuid4().hex
    key = pool_app.sleeper.tasklock_guard.lock_key((tag,), {})
    result = pool_app.sleeper.delay(tag)
    value = eventually(lambda: worker.locks.get(key), timeout=30, what="the body started")
    checks = holds_for(lambda: worker.locks.get(key) == value, 3.1, what="the same hold")
    assert checks > 10
    worker.broker.set(f"go:{tag}", 1)
    assert result.get(timeout=30) > 1
    assert worker.locks.get(key) is None, "released at the end"


def lines_with(worker: PoolWorker, *parts: str) -> list[str]:
    return [ln for ln in worker.log().splitlines() if all(part in ln for part in parts)]


@pools("threads", "gevent", "eventlet")
def test_cpu_bound_body_starves_only_a_green_watchdog(worker: PoolWorker) -> None:
    """ttl=1 and a 1.5 s body that never yields. A thread pool's watchdog thread still runs (the
    GIL switches threads) and keeps the lock. Under gevent and eventlet the watchdog is a greenlet
    that cannot run until the body yields or ends: the lock expires under the running body. That
    cannot be prevented from inside the process, but it is reported, with the lock, how late, and
    the remedy: at the release, when the body never yielded; by the watchdog's next tick, when
    the body yields before it returns (then_sleep)."""
    released, ticked = uuid.uuid4().hex, uuid.uuid4().hex
    released_key = pool_app.cpu_bound.tasklock_guard.lock_key((released, 1.5), {})
    ticked_key = pool_app.cpu_bound.tasklock_guard.lock_key((ticked, 1.5), {})
    assert pool_app.cpu_bound.delay(released, 1.5).get(timeout=60) > 0
    if worker.pool not in GREEN:
        # The result is stored after the release: its verdict is in the log already.
        assert lines_with(worker, released_key) == [], "no warning, no loss: the lock was kept"
        return
    # Under gevent nothing yields between the body's end and the release, which reports it.
    # Eventlet switches once on the way (its watchdog tick reports it then): either will do.
    release_report = f"lock {released_key!r} released"
    [line] = eventually(
        lambda: lines_with(worker, release_report)
        or (worker.pool == "eventlet" and lines_with(worker, "watchdog ran late", released_key)),
        timeout=30, what="the late-renewal warning in the worker's log",
    )  # fmt: skip
    assert "WARNING" in line
    if release_report in line:
        assert "after its renewal was due, and the watchdog never sent it (TTL 1 s)" in line
        assert "its TTL ran out" in line
    assert "a task body that does not yield" in line
    assert "gevent.sleep(0)" in line
    eventually(lambda: lines_with(worker, "no longer held at release", released_key),
               timeout=30, what="the release found the lock gone")  # fmt: skip

    assert pool_app.cpu_bound.delay(ticked, 1.5, then_sleep=0.5).get(timeout=60) > 0
    [line] = eventually(
        lambda: lines_with(worker, "watchdog ran late", ticked_key), timeout=30,
        what="the watchdog's late-tick warning in the worker's log",
    )  # fmt: skip
    assert "WARNING" in line
    assert f"{ticked_key!r} by " in line
    assert "ran out: the renewal will most likely find it gone" in line
    assert "a task body that does not yield" in line
    eventually(lambda: lines_with(worker, "lost while held", ticked_key),
               timeout=30, what="the renewal found the lock gone")  # fmt: skip
