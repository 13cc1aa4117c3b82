"""The payments database (SQLite), with a fence on the one write that moves money.

:func:`transfer` checks the fencing token and writes in one transaction: the account remembers the
highest token that ever wrote for it, and a write carrying a token that is not higher comes from a
worker whose lock expired while it was stalled (GC pause, frozen VM, lost network) and a newer
holder went ahead. That write is rejected and nothing changes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager

SCHEMA = """
CREATE TABLE IF NOT EXISTS payments (
    id INTEGER PRIMARY KEY,
    account_id INTEGER NOT NULL,
    cents INTEGER NOT NULL,
    transfer_id INTEGER            -- NULL while pending
);
CREATE TABLE IF NOT EXISTS transfers (
    id INTEGER PRIMARY KEY,
    account_id INTEGER NOT NULL,
    cents INTEGER NOT NULL,
    fence INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS fences (  -- highest fencing token that wrote, per account
    account_id INTEGER PRIMARY KEY,
    fence INTEGER NOT NULL
);
"""


class StaleFence(Exception):
    """A write carried a fencing token that a newer lock holder has already superseded."""


@contextmanager
def transaction(path: str) -> Iterator[sqlite3.Connection]:
    """One write transaction; BEGIN IMMEDIATE makes the fence check and the write atomic."""
    with closing(sqlite3.connect(path, timeout=30, isolation_level=None)) as db:
        db.executescript(SCHEMA)
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")


def add_payment(path: str, account_id: int, cents: int) -> None:
    with transaction(path) as db:
        db.execute("INSERT INTO payments (account_id, cents) VALUES (?, ?)", (account_id, cents))


def pending(path: str, account_id: int) -> list[tuple[int, int]]:
    """``(payment id, cents)`` of the account's payments not transferred yet."""
    with transaction(path) as db:
        rows = db.execute(
            "SELECT id, cents FROM payments WHERE account_id = ? AND transfer_id IS NULL",
            (account_id,),
        )
        return [(row[0], row[1]) for row in rows]


def transfer(path: str, account_id: int, payment_ids: list[int], fence: int) -> int:
    """Pay out ``payment_ids`` in one transfer; its id. StaleFence if ``fence`` is outdated."""
    with transaction(path) as db:
        row = db.execute("SELECT fence FROM fences WHERE account_id = ?", (account_id,)).fetchone()
        if row is not None and fence <= row[0]:
            raise StaleFence(
                f"account {account_id}: token {fence} <= {row[0]}, which already wrote"
            )
        db.execute(
            "INSERT INTO fences VALUES (?, ?) "
            "ON CONFLICT (account_id) DO UPDATE SET fence = excluded.fence",
            (account_id, fence),
        )
        marks = ",".join("?" * len(payment_ids))
        (cents,) = db.execute(
            f"SELECT COALESCE(SUM(cents), 0) FROM payments WHERE id IN ({marks})", payment_ids
        ).fetchone()
        cursor = db.execute(
            "INSERT INTO transfers (account_id, cents, fence) VALUES (?, ?, ?)",
            (account_id, cents, fence),
        )
        db.execute(
            f"UPDATE payments SET transfer_id = ? WHERE id IN ({marks})",
            [cursor.lastrowid, *payment_ids],
        )
        return int(cursor.lastrowid or 0)


def transfers(path: str) -> list[tuple[int, int, int]]:
    """``(account id, cents, fence)`` of every transfer, in order."""
    with transaction(path) as db:
        rows = db.execute("SELECT account_id, cents, fence FROM transfers ORDER BY id")
        return [(row[0], row[1], row[2]) for row in rows]
