"""A fenced register in SQLite: a write is accepted only with a token above every token seen.

This is the storage side of fencing. The lock hands out increasing tokens; the storage remembers
the highest one that wrote and refuses anything older, so a writer whose lock expired behind its
back cannot overwrite the work of the holder that came after it.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing

SCHEMA = "CREATE TABLE IF NOT EXISTS register (key TEXT PRIMARY KEY, value TEXT, fence INTEGER)"


def write(path: str, key: str, value: str, fence: int) -> tuple[bool, int]:
    """``(accepted, highest token seen)``; the check and the write are one transaction."""
    with closing(sqlite3.connect(path, timeout=30, isolation_level=None)) as db:
        db.execute(SCHEMA)
        db.execute("BEGIN IMMEDIATE")
        row = db.execute("SELECT fence FROM register WHERE key = ?", (key,)).fetchone()
        if row is not None and fence <= row[0]:
            db.execute("ROLLBACK")
            return False, int(row[0])
        db.execute("INSERT OR REPLACE INTO register VALUES (?, ?, ?)", (key, value, fence))
        db.execute("COMMIT")
        return True, fence


def read(path: str, key: str) -> tuple[str, int] | None:
    with closing(sqlite3.connect(path, timeout=30)) as db:
        db.execute(SCHEMA)
        row = db.execute("SELECT value, fence FROM register WHERE key = ?", (key,)).fetchone()
        return None if row is None else (str(row[0]), int(row[1]))
