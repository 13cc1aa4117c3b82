"""The pending marker's TTL on the server, for Celery calls sent with ``countdown``/``eta`` while
the producer's wall clock is frozen (freezegun) or moved: ``pending_ttl`` plus the seconds until
the call is due, exactly as the producer's clock reads them.

Only the producer's clock is frozen; the server's is real, so a PTTL read back is the TTL set
less the few milliseconds between the SET and the PTTL (``SLACK``). Every wrong reading this
guards against is off by a minute or more. The calls go to a queue no worker consumes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from celery import Celery
from freezegun import freeze_time

from tasklock.celery import singleton_task
from tasklock.guard import reset_all
from tests.integration.celery.support import configure, parked_client
from tests.support.servers import RedisServer

PARKED = "tl-pending-clock-parked"  # no worker consumes it
PENDING_TTL = 60
SLACK_MS = 2000  # SET to PTTL on a loaded machine; every wrong reading is off by 60 s or more
UTC = dt.UTC
NOW = dt.datetime(2025, 3, 30, 0, 30, tzinfo=UTC)  # 01:30 in Berlin, 30 min before DST starts
#: 03:30 in Berlin that night: one hour after NOW (02:00-03:00 does not exist there that night).
BERLIN_0330 = dt.datetime(2025, 3, 30, 3, 30, tzinfo=ZoneInfo("Europe/Berlin"))


@pytest.fixture
def rc(redis_server: RedisServer) -> Iterator[redis.Redis]:
    yield from parked_client(redis_server, PARKED)


@pytest.fixture
def report(redis_server: RedisServer, rc: redis.Redis) -> Iterator[Any]:
    """A dedupe_enqueue task on an app whose time zone is New York (naive etas are still UTC)."""
    app = configure(
        Celery(f"pending-clock{id(object())}", set_as_current=False),
        redis_server.url,
        timezone="America/New_York",
    )

    @singleton_task(
        app=app, name="clock.report", dedupe_enqueue=True, pending_ttl=PENDING_TTL, shared=False
    )
    def report(number: int) -> int:
        return number

    yield report
    reset_all()


def marker_pttl(rc: redis.Redis, task: Any, number: int) -> int:
    return int(rc.pttl(task.tasklock_guard.pending_key((number,), {})))


def assert_ttl(rc: redis.Redis, task: Any, number: int, seconds: float) -> None:
    expected = int(seconds * 1000)
    pttl = marker_pttl(rc, task, number)
    assert expected - SLACK_MS < pttl <= expected, f"PTTL {pttl} ms, expected {expected} ms"


SENDS: dict[str, tuple[dict[str, Any], float]] = {
    "naive eta in 2 h (UTC)": ({"eta": NOW.replace(tzinfo=None) + dt.timedelta(hours=2)}, 7200),
    "ISO eta in 2 h": ({"eta": (NOW + dt.timedelta(hours=2)).isoformat()}, 7200),
    "eta across DST (1 h)": ({"eta": BERLIN_0330}, 3600),
    "eta a minute ago": ({"eta": NOW - dt.timedelta(minutes=1)}, 0),
    "eta 3 years ahead": ({"eta": NOW + dt.timedelta(days=3 * 365)}, 3 * 365 * 86400),
    "countdown 90 s": ({"countdown": 90}, 90),
    "countdown 0, eta in 2 h": ({"countdown": 0, "eta": NOW + dt.timedelta(hours=2)}, 7200),
    "no schedule": ({}, 0),
}  # fmt: skip


@pytest.mark.parametrize("form", list(SENDS))
def test_the_marker_lives_pending_ttl_past_when_the_call_is_due(
    rc: redis.Redis, report: Any, form: str
) -> None:
    options, due_in = SENDS[form]
    with freeze_time(NOW):
        first = report.apply_async((1,), queue=PARKED, **options)
    assert_ttl(rc, report, 1, PENDING_TTL + due_in)
    # While it is pending, the same call again is that call.
    assert report.apply_async((1,), queue=PARKED, **options).id == first.id


def test_the_delay_is_counted_from_the_producers_clock_when_it_sends(
    rc: redis.Redis, report: Any
) -> None:
    """One eta, sent as three calls at three wall-clock instants: each marker lives until that
    eta plus pending_ttl, so the later the send, the shorter its TTL. A duplicate sent later
    leaves the first call's marker as it was."""
    eta = NOW + dt.timedelta(hours=2)
    with freeze_time(NOW) as clock:
        first = report.apply_async((1,), queue=PARKED, eta=eta)
        clock.tick(dt.timedelta(minutes=30))
        report.apply_async((2,), queue=PARKED, eta=eta)
        clock.move_to(eta - dt.timedelta(seconds=10))
        report.apply_async((3,), queue=PARKED, eta=eta)
        clock.move_to(eta + dt.timedelta(hours=1))
        report.apply_async((4,), queue=PARKED, eta=eta)  # overdue: due at once
        assert report.apply_async((1,), queue=PARKED, eta=eta).id == first.id
    assert_ttl(rc, report, 1, PENDING_TTL + 7200)
    assert_ttl(rc, report, 2, PENDING_TTL + 5400)
    assert_ttl(rc, report, 3, PENDING_TTL + 10)
    assert_ttl(rc, report, 4, PENDING_TTL)
