"""The payments database (SQLite, through SQLAlchemy), with a fence on the one write that moves
money.

:func:`transfer` runs ``tasklock.fencing.sqlalchemy.fence()`` first in its transaction: the fence
table keeps the newest token that wrote for each account, and a token older than that comes from a
worker whose lock expired while it was stalled (GC pause, frozen VM, lost network) after which a
newer holder went ahead. That write raises :class:`tasklock.StaleFence` and the transaction rolls
back: nothing changes.
"""

from __future__ import annotations

import functools

import sqlalchemy as sa

from tasklock.fencing.sqlalchemy import fence, fence_table

metadata = sa.MetaData()
PAYMENTS = sa.Table(
    "payments",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("account_id", sa.Integer, nullable=False),
    sa.Column("cents", sa.Integer, nullable=False),
    sa.Column("transfer_id", sa.Integer),  # NULL while pending
)
TRANSFERS = sa.Table(
    "transfers",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("account_id", sa.Integer, nullable=False),
    sa.Column("cents", sa.Integer, nullable=False),
    sa.Column("fence", sa.BigInteger, nullable=False),
)
FENCES = fence_table(metadata)  # "tasklock_fence": the newest token per resource


@functools.cache
def engine(path: str) -> sa.Engine:
    """The SQLite file at ``path``, its tables created (SQLite 3.35+ for ``fence()``)."""
    db = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 30})
    metadata.create_all(db)
    return db


def add_payment(path: str, account_id: int, cents: int) -> None:
    with engine(path).begin() as conn:
        conn.execute(sa.insert(PAYMENTS).values(account_id=account_id, cents=cents))


def pending(path: str, account_id: int) -> list[tuple[int, int]]:
    """``(payment id, cents)`` of the account's payments not transferred yet."""
    query = sa.select(PAYMENTS.c.id, PAYMENTS.c.cents).where(
        PAYMENTS.c.account_id == account_id, PAYMENTS.c.transfer_id.is_(None)
    )
    with engine(path).connect() as conn:
        return [(row.id, row.cents) for row in conn.execute(query)]


def transfer(path: str, account_id: int, payment_ids: list[int], fence_token: int) -> int:
    """Pay out those of ``payment_ids`` still pending, in one transfer; the cents paid (0 if none
    was left). :class:`tasklock.StaleFence` if a newer token has written for the account."""
    with engine(path).begin() as conn:
        fence(conn, FENCES, f"account:{account_id}", fence_token)  # first, before any read
        # Read again under the fence: a holder that wrote before us may have paid some already.
        still_pending = PAYMENTS.c.id.in_(payment_ids) & PAYMENTS.c.transfer_id.is_(None)
        cents = conn.scalar(sa.select(sa.func.sum(PAYMENTS.c.cents)).where(still_pending))
        if not cents:
            return 0
        transfer_id = conn.scalar(
            sa.insert(TRANSFERS)
            .values(account_id=account_id, cents=cents, fence=fence_token)
            .returning(TRANSFERS.c.id)
        )
        conn.execute(sa.update(PAYMENTS).where(still_pending).values(transfer_id=transfer_id))
        return int(cents)


def transfers(path: str) -> list[tuple[int, int, int]]:
    """``(account id, cents, fence)`` of every transfer, in order."""
    query = sa.select(TRANSFERS.c.account_id, TRANSFERS.c.cents, TRANSFERS.c.fence)
    with engine(path).connect() as conn:
        rows = conn.execute(query.order_by(TRANSFERS.c.id))
        return [(row.account_id, row.cents, row.fence) for row in rows]
