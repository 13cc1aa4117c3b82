"""Fleet counts' windows on a frozen and moved wall clock (freezegun), on a real redis-server:
the writer files each count in the 10-minute slot of its wall-clock instant, and a reader's
``hour``/``day`` windows and the week a task stays listed are counted from its own clock.

Exact edges: ``hour`` is the current slot and the five before it (a count leaves it when the sixth
slot after its own begins), ``day`` the current and the 143 before, and a task stays listed for
exactly ``TOTALS_TTL`` after its last count (its keys' own TTLs run on the server's real clock
and are not what is moved here).
"""

from __future__ import annotations

import datetime as dt

import redis
from freezegun import freeze_time

from tasklock import fleet, stats

TASK = "fleet.clock"
SLOT = dt.timedelta(seconds=fleet.BUCKET_SECONDS)
#: Five minutes into a slot (slots start on multiples of 600 s of the epoch).
SLOT_START = dt.datetime(2025, 6, 1, 12, 0, tzinfo=dt.UTC)
T = SLOT_START + dt.timedelta(minutes=5)


def count(r: redis.Redis, ran: int) -> None:
    fleet.bind(TASK, r, "tasklock")
    for _ in range(ran):
        stats.increment("ran", TASK)
    fleet.flush()


def ran(r: redis.Redis, window: str) -> int | None:
    found = fleet.read_counts(r, window=window).get(TASK)
    return None if found is None else found["ran"]


def test_the_premise_t_is_five_minutes_into_a_slot() -> None:
    assert SLOT_START.timestamp() % fleet.BUCKET_SECONDS == 0


def test_counts_leave_the_hour_and_the_day_slot_by_slot(r: redis.Redis) -> None:
    fleet.flush()  # nothing of other tests' in the batches below
    with freeze_time(T) as clock:
        count(r, 3)  # in slot 0
        clock.tick(SLOT)
        count(r, 2)  # in slot 1
        assert (ran(r, "hour"), ran(r, "day"), ran(r, "total")) == (5, 5, 5)

        clock.move_to(SLOT_START + 6 * SLOT - dt.timedelta(microseconds=1))
        assert ran(r, "hour") == 5  # slot 0 is the oldest of the hour's six
        clock.move_to(SLOT_START + 6 * SLOT)
        assert ran(r, "hour") == 2
        clock.move_to(SLOT_START + 7 * SLOT)
        assert (ran(r, "hour"), ran(r, "day"), ran(r, "total")) == (0, 5, 5)

        clock.move_to(SLOT_START + 144 * SLOT - dt.timedelta(microseconds=1))
        assert ran(r, "day") == 5
        clock.move_to(SLOT_START + 144 * SLOT)
        assert ran(r, "day") == 2
        clock.move_to(SLOT_START + 145 * SLOT)
        assert (ran(r, "day"), ran(r, "total")) == (0, 5)


def test_a_task_stays_listed_for_a_week_after_its_last_count(r: redis.Redis) -> None:
    fleet.flush()
    week = dt.timedelta(seconds=fleet.TOTALS_TTL)
    with freeze_time(T) as clock:
        count(r, 1)
        clock.tick(dt.timedelta(days=3))
        count(r, 1)  # the last count: the week runs from here
        clock.move_to(T + dt.timedelta(days=3) + week)
        assert ran(r, "total") == 2
        clock.tick(dt.timedelta(seconds=1))
        assert ran(r, "total") is None
