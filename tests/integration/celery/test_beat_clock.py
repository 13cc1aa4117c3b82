"""HA beat's last runs across a takeover, on a frozen and moved wall clock (freezegun), in one
process: two :class:`~tasklock.celery.LeaderScheduler` beats of one app, each wrapping Celery's
in-memory ``Scheduler`` with one entry every 60 s, on a real redis-server (the leadership lock,
the last-run hash, and the broker, where sent entries are counted on a queue nobody consumes).

What is pinned, exactly, since Celery's schedules read the same frozen clock:

* the leader records each send at the wall-clock instant it sends (the hash holds its epoch);
* a beat that takes over moves an entry its own state says is overdue to the recorded send, so
  it sends nothing until one period after that send, and then sends (not before, not twice);
* an entry whose own last run is later than the record (naive UTC, as Celery keeps it with
  ``enable_utc``, read with the host in Tokyo) is left alone.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from freezegun import freeze_time

from tasklock.celery import LeaderScheduler
from tests.integration.celery.support import configure, host_time_zone, parked_client
from tests.support.servers import RedisServer

PARKED = "tl-beat-clock-parked"  # no worker consumes it
UTC = dt.UTC
NOW = dt.datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
PERIOD = 60.0


@pytest.fixture(autouse=True)
def host_in_tokyo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The host's local time is UTC+9: a naive UTC datetime read as local would be 9 h early."""
    with host_time_zone(monkeypatch, "Asia/Tokyo"):
        yield


@pytest.fixture
def rc(redis_server: RedisServer) -> Iterator[redis.Redis]:
    yield from parked_client(redis_server, PARKED)


@pytest.fixture
def make_beat(redis_server: RedisServer, rc: redis.Redis) -> Iterator[Any]:
    """Beats of one app (one lock, one last-run hash), each with its own schedule state: the
    entry's ``last_run_at`` as that beat's state has it."""
    made: list[LeaderScheduler] = []

    def make(last_run_at: dt.datetime) -> LeaderScheduler:
        app = configure(
            Celery("tl-beat-clock", set_as_current=False),
            redis_server.url,
            tasklock_beat_scheduler="celery.beat:Scheduler",  # in memory, no shelve file
            beat_schedule={
                "ping": {
                    "task": "beat_clock.ping",
                    "schedule": PERIOD,
                    "options": {"queue": PARKED},
                    "last_run_at": last_run_at,
                }
            },
        )
        beat = LeaderScheduler(app)
        made.append(beat)
        return beat

    yield make
    for beat in made:
        beat.close()


def last_run(beat: LeaderScheduler) -> dt.datetime:
    return beat.scheduler.schedule["ping"].last_run_at  # type: ignore[no-any-return]


def recorded(rc: redis.Redis, beat: LeaderScheduler) -> float:
    return float(rc.hget(beat.last_run_key, "ping"))  # type: ignore[arg-type]


def sent(rc: redis.Redis) -> int:
    return int(rc.llen(PARKED))


def test_a_new_leader_resumes_from_the_last_send_not_from_its_own_state(
    rc: redis.Redis, make_beat: Any
) -> None:
    with freeze_time(NOW) as clock:
        first = make_beat(NOW - dt.timedelta(seconds=PERIOD + 1))  # overdue by its own state
        first.tick()
        assert sent(rc) == 1
        assert recorded(rc, first) == NOW.timestamp()

        # The first beat goes away; the second's own state is ten minutes old, so by itself it
        # would send at once. Ten seconds after the first one's send, it takes over.
        clock.tick(dt.timedelta(seconds=10))
        first.close()
        second = make_beat(NOW - dt.timedelta(minutes=10))
        second.tick()
        assert sent(rc) == 1, "the new leader sent what the old one sent ten seconds ago"
        assert last_run(second) == NOW
        assert second.scheduler.schedule["ping"].is_due() == (False, PERIOD - 10)

        clock.move_to(NOW + dt.timedelta(seconds=PERIOD - 1))
        second.tick()
        assert sent(rc) == 1  # a second early

        clock.move_to(NOW + dt.timedelta(seconds=PERIOD))
        second.tick()
        assert sent(rc) == 2
        assert recorded(rc, second) == NOW.timestamp() + PERIOD
        second.tick()
        assert sent(rc) == 2  # once per period


def test_an_own_last_run_later_than_the_record_is_kept(rc: redis.Redis, make_beat: Any) -> None:
    with freeze_time(NOW) as clock:
        first = make_beat(NOW - dt.timedelta(seconds=PERIOD + 1))
        first.tick()
        first.close()
        # Its own state (naive UTC, as Celery keeps it) says it sent 20 s after the record.
        clock.tick(dt.timedelta(seconds=30))
        own = NOW.replace(tzinfo=None) + dt.timedelta(seconds=20)
        second = make_beat(own)
        second.tick()
        assert last_run(second).replace(tzinfo=None) == own
        assert second.scheduler.schedule["ping"].is_due() == (False, PERIOD - 10)
        assert sent(rc) == 1
