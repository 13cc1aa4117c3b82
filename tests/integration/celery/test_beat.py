"""HA ``celery beat``: three real ``celery beat -S tasklock.celery.LeaderScheduler`` processes and
one ``celery worker`` on the module's redis-server (issue 16).

Every tick carries when and by which beat it was sent (evaluated in the beat at send time, see
``beat_app``), so "one tick per period" is judged from send times: no two consecutive ticks may be
closer than :data:`MIN_GAP`. A double tick (two beats sending in one period, or a new leader
re-sending what the old one just sent) is a gap near zero; beat's own jitter is milliseconds.

* a stable cluster: one leader sends, the others wait (and say so), the lock shows its owner;
* SIGKILL the leader: a standby sends within one TTL plus one period (plus slack);
* SIGTERM the leader right after it sent: it resigns, a standby takes over at once, and does not
  send again in that period (the last runs it reads from Redis at takeover);
* SIGSTOP the leader past its TTL, a standby takes over, SIGCONT: the old leader steps down and
  sends nothing more.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.beat import PersistentScheduler, Scheduler

from tasklock.celery import LeaderScheduler
from tasklock.core.owner import parse_value
from tasklock.errors import ConfigurationError
from tests.integration.celery.beat_app import PERIOD, TTL
from tests.integration.celery.support import ROOT, WorkerProcess, clear_tasklock_keys
from tests.support.polling import eventually
from tests.support.servers import RedisServer

pytestmark = pytest.mark.slow

MODULE = "tests.integration.celery.beat_app"
LOCK = "tasklock:beat:tl_beat"
#: Consecutive sends closer than this are two ticks in one period.
MIN_GAP = 0.6 * PERIOD
#: Failover: the dead leader's lease runs out (TTL), the standby's next campaign (at most
#: TTL/2 later), then the entry's next due time (at most one period); plus slack for start-up.
FAILOVER = TTL + TTL / 2 + PERIOD + 1.5


class Beat:
    """One ``celery beat`` subprocess in its own session, with its own schedule file."""

    def __init__(self, directory: Path, number: int, env: dict[str, str]) -> None:
        self.log_path = directory / f"beat{number}.log"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", MODULE, "beat",
                 "-S", "tasklock.celery.LeaderScheduler", "-l", "INFO",
                 f"--schedule={directory / f'schedule{number}'}",
                 f"--pidfile={directory / f'beat{number}.pid'}"],
                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.pid = self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(30)


@pytest.fixture(scope="module")
def env(redis_server: RedisServer) -> dict[str, str]:
    return {**os.environ, "TL_TEST_URL": redis_server.url, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def worker(
    redis_server: RedisServer, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    ping = Celery("tl_beat_ping", broker=redis_server.url)
    process = WorkerProcess(
        MODULE, env, tmp_path_factory.mktemp("beat") / "worker.log", pool="solo", concurrency=1
    )
    process.start(ping)
    yield process
    process.stop()


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    clear_tasklock_keys(client)  # a lock or last runs left by the previous test's beats
    yield client
    client.close()


@pytest.fixture
def beats(
    worker: WorkerProcess, env: dict[str, str], client: redis.Redis, tmp_path: Path
) -> Iterator[tuple[list[Beat], str]]:
    """Three beats of one fresh run: the run id keeps earlier tests' ticks apart."""
    run = uuid.uuid4().hex
    started = [Beat(tmp_path, n, {**env, "TL_BEAT_RUN": run}) for n in range(3)]
    yield started, run
    for beat in started:
        beat.stop()
    clear_tasklock_keys(client)


def ticks(client: redis.Redis, run: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in client.lrange(f"beat:ticks:{run}", 0, -1)]


def leader_pid(client: redis.Redis) -> int | None:
    value = client.get(LOCK)
    return None if value is None else int(parse_value(value).meta["pid"])


def assert_one_per_period(sent: list[dict[str, Any]]) -> None:
    times = sorted(tick["at"] for tick in sent)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(times)]
    assert all(gap >= MIN_GAP for gap in gaps), f"two ticks in one period: gaps {gaps}"


def wait_for_ticks(client: redis.Redis, run: str, count: int, timeout: float) -> list[Any]:
    return eventually(
        lambda: (found := ticks(client, run)) and len(found) >= count and found,
        timeout=timeout,
        interval=0.02,
        what=f"{count} ticks",
    )


def by_pid(started: list[Beat], pid: int) -> Beat:
    return next(beat for beat in started if beat.pid == pid)


def test_one_leader_ticks_once_per_period(
    beats: tuple[list[Beat], str], client: redis.Redis
) -> None:
    started, run = beats
    sent = wait_for_ticks(client, run, 6, timeout=30)
    assert_one_per_period(sent)
    senders = {tick["pid"] for tick in sent}
    assert len(senders) == 1, f"one leader sends in a stable cluster, not {senders}"
    pid = senders.pop()
    assert leader_pid(client) == pid
    holder = parse_value(client.get(LOCK) or b"")
    assert holder.meta["name"] == "celery beat"
    assert holder.meta["role"] == "beat"
    assert holder.meta["host"]
    assert holder.fence is not None
    leader = by_pid(started, pid)
    assert f"became leader of {LOCK} (term {holder.fence})" in leader.log()
    assert "elected leader" not in leader.log()  # the election is logged once, by the beat
    for standby in started:
        if standby is not leader:
            assert eventually(
                lambda b=standby: f"waiting: {holder.meta['host']} pid {pid}" in b.log()
            )


def test_sigkill_the_leader_a_standby_ticks_within_one_ttl(
    beats: tuple[list[Beat], str], client: redis.Redis
) -> None:
    started, run = beats
    first = wait_for_ticks(client, run, 2, timeout=30)[0]["pid"]
    dead = by_pid(started, first)
    dead.signal(signal.SIGKILL)
    killed_at = time.time()
    dead.process.wait(10)
    after = eventually(
        lambda: [t for t in ticks(client, run) if t["pid"] != first],
        timeout=FAILOVER + 2,
        interval=0.02,
        what="a tick from a standby",
    )
    assert after[0]["at"] - killed_at <= FAILOVER
    count = len(ticks(client, run))
    sent = wait_for_ticks(client, run, count + 2, timeout=10)
    assert_one_per_period(sent)
    assert len({t["pid"] for t in sent if t["at"] > killed_at}) == 1


def test_sigterm_the_leader_right_after_a_tick_no_tick_twice(
    beats: tuple[list[Beat], str], client: redis.Redis
) -> None:
    """The leader resigns when it shuts down, so a standby takes over within milliseconds; its
    own schedule state says the entry is long due, and only the last runs it reads from Redis
    keep it from sending again in the period the old leader just sent in."""
    started, run = beats
    sent = wait_for_ticks(client, run, 2, timeout=30)
    count = len(sent)
    latest = wait_for_ticks(client, run, count + 1, timeout=10)[-1]
    leaving = by_pid(started, latest["pid"])
    leaving.signal(signal.SIGTERM)  # at most a few ms after it sent: the worker recorded it
    leaving.process.wait(10)
    assert "resigned leadership" in leaving.log()
    after = eventually(
        lambda: [t for t in ticks(client, run) if t["pid"] != latest["pid"]],
        timeout=TTL + PERIOD + 2,
        interval=0.02,
        what="a tick from the new leader",
    )
    assert after
    sent = wait_for_ticks(client, run, len(ticks(client, run)) + 1, timeout=10)
    assert_one_per_period(sent)
    assert any("resume from the last leader's runs" in beat.log() for beat in started)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_standby_exits_on_sigterm_and_sigint(
    beats: tuple[list[Beat], str], client: redis.Redis, signum: int
) -> None:
    """A standby waits for leadership inside ``tick()``; beat's signal handler runs on that same
    thread and closes the scheduler, which resigns. It used to wait on the Leader's guard that
    its own campaign held, for ever (issue 32): every rolling restart waited out the SIGKILL."""
    started, run = beats
    wait_for_ticks(client, run, 1, timeout=30)
    leading = leader_pid(client)
    standbys = [beat for beat in started if beat.pid != leading]
    standby = standbys[0]
    eventually(lambda: "waiting:" in standby.log(), timeout=30, what="the standby waiting")
    standby.signal(signum)
    try:
        standby.process.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the standby did not exit on {signal.Signals(signum).name}")
    assert leader_pid(client) == leading  # the leader went on, undisturbed


def test_sigstop_the_leader_past_its_ttl_no_double_tick_when_it_resumes(
    beats: tuple[list[Beat], str], client: redis.Redis
) -> None:
    started, run = beats
    old = wait_for_ticks(client, run, 2, timeout=30)[0]["pid"]
    paused = by_pid(started, old)
    paused.signal(signal.SIGSTOP)
    stopped_at = time.time()
    eventually(
        lambda: [t for t in ticks(client, run) if t["pid"] != old],
        timeout=FAILOVER + 2,
        interval=0.02,
        what="a standby leads while the leader is stopped",
    )
    new = leader_pid(client)
    assert new is not None
    assert new != old
    # The store's lease may end before TTL has passed since the stop (the last renewal came up to
    # TTL/3 before it); the point is a pause past the TTL by the paused process's own clock, so
    # waiting out that time is the test itself.
    time.sleep(max(0.0, stopped_at + TTL + 0.5 - time.time()))
    paused.signal(signal.SIGCONT)
    resumed_at = time.time()
    # The point is what happens over the next periods: waiting them out is the test itself.
    count = len(ticks(client, run))
    sent = wait_for_ticks(client, run, count + 3, timeout=10)
    assert_one_per_period(sent)
    assert not [t for t in sent if t["pid"] == old and t["at"] > resumed_at]
    assert leader_pid(client) == new
    assert f"stepped down from {LOCK}" in paused.log()


# -- settings ------------------------------------------------------------------------------------


def _app(redis_server: RedisServer, **conf: Any) -> Celery:
    app = Celery("tl_beat_conf", broker=redis_server.url)
    app.conf.update(**conf)
    return app


@pytest.mark.parametrize("ttl", [0.5, 0, "10", True, float("nan"), float("inf"), 10**9])
def test_a_bad_tasklock_beat_ttl_is_refused(redis_server: RedisServer, ttl: object) -> None:
    with pytest.raises(ConfigurationError, match="^tasklock_beat_ttl must be"):
        LeaderScheduler(_app(redis_server, tasklock_beat_ttl=ttl), lazy=True)


def test_an_amqp_broker_without_a_tasklock_url_says_where_beat_reads_it(
    tmp_path: Path,
) -> None:
    app = Celery("tl_beat_amqp", broker="amqp://guest@127.0.0.1:1//")
    with pytest.raises(ConfigurationError) as error:
        LeaderScheduler(app, schedule_filename=str(tmp_path / "schedule"))
    message = str(error.value)
    assert message.startswith("celery beat: no Redis configured for tasklock")
    assert "tasklock_url" in message
    assert "to the task" not in message  # beat has no task options to pass url= to


@pytest.mark.parametrize("path", ["no_such_module:Scheduler", "celery.beat:NoSuch", "os:path"])
def test_a_bad_tasklock_beat_scheduler_is_refused(redis_server: RedisServer, path: str) -> None:
    with pytest.raises(ConfigurationError, match="tasklock_beat_scheduler"):
        LeaderScheduler(_app(redis_server, tasklock_beat_scheduler=path), lazy=True)


def test_it_wraps_the_scheduler_class_named(redis_server: RedisServer, tmp_path: Path) -> None:
    class Custom(Scheduler):
        pass

    wrapped = LeaderScheduler(
        _app(redis_server, tasklock_beat_scheduler=Custom), lazy=True, max_interval=3
    )
    assert isinstance(wrapped.scheduler, Custom)
    assert wrapped.max_interval == 3
    default = LeaderScheduler(
        _app(redis_server, tasklock_beat_ttl=4),
        schedule_filename=str(tmp_path / "schedule"),
        max_interval=2,
    )
    try:
        assert isinstance(default.scheduler, PersistentScheduler)
        assert default.leader.ttl == 4
        assert default.leader.name == LOCK.replace("tl_beat", "tl_beat_conf")
    finally:
        default.close()
