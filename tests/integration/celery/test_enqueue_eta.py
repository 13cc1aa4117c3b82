"""``dedupe_enqueue`` with an ``eta``: the pending marker lives until the call is due plus
``pending_ttl``, with "due" read exactly as Celery's worker reads the message.

The worker's own reading is the reference: each call is sent to a queue no worker consumes, taken
back off it, and handed to :class:`celery.worker.request.Request`, whose ``eta`` is the instant
the worker would run it. Run under two host time zones either side of UTC (``TZ`` and
``time.tzset()``): tasklock used to read a naive ``eta`` as the host's local time (Tokyo: the
marker expired hours before the call was due, letting a duplicate in) and an ISO string as "now".
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.worker.request import Request

from tasklock.celery import singleton_task
from tasklock.guard import reset_all
from tests.integration.celery.support import configure, host_time_zone, parked_client
from tests.support.servers import RedisServer

PARKED = "tl-eta-parked"  # no worker consumes it
PENDING_TTL = 60
AHEAD = datetime.timedelta(hours=2)


@pytest.fixture(params=["Asia/Tokyo", "America/New_York"])
def host_tz(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with host_time_zone(monkeypatch, request.param) as zone:
        yield zone


@pytest.fixture
def rc(redis_server: RedisServer) -> Iterator[redis.Redis]:
    yield from parked_client(redis_server, PARKED)


def make_task(redis_server: RedisServer, **conf: Any) -> Any:
    app = configure(Celery(f"eta{id(object())}", set_as_current=False), redis_server.url, **conf)

    @singleton_task(
        app=app, name="eta.report", dedupe_enqueue=True, pending_ttl=PENDING_TTL, shared=False
    )
    def report(number: int) -> int:
        return number

    return report


def due_per_celery(task: Any) -> float:
    """The instant (epoch seconds) Celery's worker would run the one parked message."""
    with task.app.connection_for_read() as connection:
        message = connection.default_channel.basic_get(PARKED, no_ack=True)
    assert message is not None, "nothing was sent"
    eta = Request(message, app=task.app, task=task).eta
    assert eta is not None
    return float(eta.timestamp())


def naive_utc_in(delta: datetime.timedelta) -> datetime.datetime:
    """A naive datetime ``delta`` from now, in UTC: what Celery's docs tell callers to pass."""
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + delta


ETAS = {
    "naive datetime": lambda: {"eta": naive_utc_in(AHEAD)},
    "naive ISO string": lambda: {"eta": naive_utc_in(AHEAD).isoformat()},
    "ISO string with an offset": lambda: {
        "eta": (datetime.datetime.now(datetime.UTC) + AHEAD)
        .astimezone(datetime.timezone(datetime.timedelta(hours=5, minutes=30)))
        .isoformat()
    },
    # Celery converts a countdown only when it is truthy; countdown=0 leaves the eta in charge.
    "countdown=0 and an eta": lambda: {"countdown": 0, "eta": naive_utc_in(AHEAD)},
}


@pytest.mark.parametrize("form", list(ETAS))
def test_the_marker_lives_until_celery_would_run_the_call(
    host_tz: str, redis_server: RedisServer, rc: redis.Redis, form: str
) -> None:
    report = make_task(redis_server)
    try:
        first = report.apply_async((1,), queue=PARKED, **ETAS[form]())
        marker = report.tasklock_guard.pending_key((1,), {})
        expires = time.time() + rc.pttl(marker) / 1000
        due = due_per_celery(report)
        assert due - time.time() > AHEAD.total_seconds() - 60  # the premise: due in about 2 h
        # pending_ttl counted from when the call is due, as Celery reads the eta (2 s of slack for
        # the time between the two readings; the old error was hours).
        assert due + PENDING_TTL - 2 < expires < due + PENDING_TTL + 2
        # And while it is pending, a duplicate submission is the same call.
        assert report.apply_async((1,), queue=PARKED, **ETAS[form]()).id == first.id
    finally:
        reset_all()


def test_a_naive_eta_follows_celery_under_another_app_timezone(
    host_tz: str, redis_server: RedisServer, rc: redis.Redis
) -> None:
    """An app with a time zone of its own (and enable_utc off): still Celery's reading."""
    report = make_task(redis_server, timezone="Australia/Sydney", enable_utc=False)
    try:
        report.apply_async((2,), queue=PARKED, eta=naive_utc_in(AHEAD))
        expires = time.time() + rc.pttl(report.tasklock_guard.pending_key((2,), {})) / 1000
        due = due_per_celery(report)
        assert due + PENDING_TTL - 2 < expires < due + PENDING_TTL + 2
    finally:
        reset_all()
