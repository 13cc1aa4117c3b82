"""``tasklock_oldest_hold_age_seconds`` on a frozen and moved wall clock (freezegun), on a real
redis-server: the age is the scraping host's wall clock less the ``at`` the holder wrote when it
acquired (its own wall clock), to the millisecond the holder writes; the oldest hold of a task
is the one reported; a hold stamped ahead of the scraper's clock is 0 old, never negative.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
import redis
from freezegun import freeze_time

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tasklock import fleet
from tasklock.guard import Guard
from tasklock.prometheus import Collector
from tests.support.guarding import hold_in_thread
from tests.support.servers import RedisServer

T = dt.datetime(2025, 6, 1, 12, 0, 0, 250000, tzinfo=dt.UTC)


def settle(account_id: int) -> str:
    return f"settled {account_id}"


def oldest_ages(url: str) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(Collector(url))
    return {
        sample.labels["task"]: sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
        if sample.name == "tasklock_oldest_hold_age_seconds"
    }


def test_the_oldest_hold_age_is_read_off_the_wall_clock(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    fleet.flush()
    guard = Guard(settle, "prom.clock", {"url": redis_server.url})
    done: list[Callable[[], None]] = []
    try:
        with freeze_time(T) as clock:
            done.append(hold_in_thread(guard, (1,)))  # acquired at T
            clock.tick(dt.timedelta(seconds=30))
            done.append(hold_in_thread(guard, (2,)))  # acquired at T + 30 s
            assert oldest_ages(redis_server.url) == {"prom.clock": 30.0}
            clock.tick(dt.timedelta(seconds=60.5))
            assert oldest_ages(redis_server.url) == {"prom.clock": 90.5}
            # The scraper's clock behind both holders' (another host, or set back): 0, not < 0.
            clock.move_to(T - dt.timedelta(minutes=5))
            assert oldest_ages(redis_server.url) == {"prom.clock": 0.0}
    finally:
        for finish in done:
            finish()
