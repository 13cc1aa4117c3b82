"""``tasklock.fencing.sqlalchemy.prune`` on a frozen and moved wall clock (freezegun), on SQLite:
a fence row is stamped with the writer's wall clock, and ``prune(older_than=...)`` deletes the
rows written more than ``older_than`` before its own wall clock, not one written exactly then.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from freezegun import freeze_time

from tasklock.fencing.sqlalchemy import fence, fence_table, prune

T = dt.datetime(2025, 6, 1, 12, 0, tzinfo=dt.UTC)
WEEK = dt.timedelta(days=7)


def test_prune_deletes_rows_not_written_for_older_than() -> None:
    engine = sa.create_engine("sqlite://")
    table = fence_table(sa.MetaData())
    table.metadata.create_all(engine)
    with freeze_time(T) as clock:
        with engine.begin() as conn:
            fence(conn, table, "old", 1)  # written at T
        clock.tick(dt.timedelta(days=2))
        with engine.begin() as conn:
            fence(conn, table, "new", 1)  # written at T + 2 days

        clock.move_to(T + WEEK)  # "old" is exactly a week old: kept
        with engine.begin() as conn:
            assert prune(conn, table, older_than=WEEK) == 0
        clock.tick(dt.timedelta(microseconds=1))
        with engine.begin() as conn:
            assert prune(conn, table, older_than=WEEK) == 1
            left = conn.execute(sa.select(table.c.resource)).scalars().all()
        assert left == ["new"]
    engine.dispose()
