"""Fencing where the data lives: check the lock's token in the store, in the writer's transaction.

A lock hands every hold a strictly increasing token (``lock.fence``, ``fence_token=`` in tasks);
that is worth something only where the protected data refuses a write whose token is older than
one already written, *inside the transaction that does the real write*. These helpers are that
check, one statement each:

* :mod:`tasklock.fencing.sqlalchemy`: ``fence(conn, table, resource, token)`` on a table of
  tokens per resource (``fence_table(metadata)``), and ``fenced_update(...)`` on a fence column of
  the protected row itself; PostgreSQL, SQLite and MySQL/MariaDB; an asyncio form for
  ``AsyncConnection``.
* :mod:`tasklock.django.fencing`: the same for Django's ORM (a model and a migration for the
  table).
* :mod:`tasklock.fencing.redis`: ``fenced_set(r, key, value, token)`` (and ``fenced_delete``)
  when Redis is the store.

A refused write raises :class:`tasklock.StaleFence` (naming the resource, the token and the newer
token seen); the caller's transaction then rolls back with everything it wrote. A token equal to
the stored one is the same hold writing twice: accepted. The rules shared by every form (what a
token must be, the SQL per dialect) are in :mod:`tasklock.fencing.rules`.
"""

from tasklock.errors import StaleFence

__all__ = ["StaleFence"]
