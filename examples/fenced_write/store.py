"""A fenced register in SQLite, through SQLAlchemy: a write whose token is older than one that
already wrote is refused.

This is the storage side of fencing. The lock hands out increasing tokens; the store keeps the
newest token that wrote each key (``tasklock.fencing.sqlalchemy``'s fence table) and refuses an
older one, in the transaction that writes, so a writer whose lock expired behind its back cannot
overwrite the work of the holder that came after it.
"""

from __future__ import annotations

import functools

import sqlalchemy as sa

from tasklock.fencing.sqlalchemy import fence, fence_table

metadata = sa.MetaData()
REGISTER = sa.Table(
    "register",
    metadata,
    sa.Column("key", sa.String, primary_key=True),
    sa.Column("value", sa.String, nullable=False),
)
FENCES = fence_table(metadata)  # "tasklock_fence": the newest token per resource


@functools.cache
def engine(path: str) -> sa.Engine:
    """The SQLite file at ``path``, its tables created (SQLite 3.35+ for ``fence()``)."""
    db = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 30})
    metadata.create_all(db)
    return db


def write(path: str, key: str, value: str, token: int | None) -> None:
    """Store ``value`` at ``key``; :class:`tasklock.StaleFence` (nothing written) if a newer
    token has written ``key``. A token equal to the newest is the same hold again: accepted."""
    with engine(path).begin() as conn:
        fence(conn, FENCES, key, token)  # first in the transaction; raises StaleFence if stale
        conn.execute(sa.delete(REGISTER).where(REGISTER.c.key == key))
        conn.execute(sa.insert(REGISTER).values(key=key, value=value))


def read(path: str, key: str) -> tuple[str, int] | None:
    """``(value, token that wrote it)``, or None if ``key`` was never written."""
    query = (
        sa.select(REGISTER.c.value, FENCES.c.token)
        .join(FENCES, FENCES.c.resource == REGISTER.c.key)
        .where(REGISTER.c.key == key)
    )
    with engine(path).connect() as conn:
        row = conn.execute(query).first()
    return None if row is None else (row.value, row.token)
