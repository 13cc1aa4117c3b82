"""Fencing with SQLAlchemy: the lock's token checked in your database, inside your transaction.

A lock's hold can end without its holder knowing (a GC pause, a frozen VM, a TTL that ran out), and
then two processes believe they hold it. Only the store can tell them apart, by refusing a write
whose token is older than one it has already taken. Each helper here is that refusal, made in the
transaction that does the real write, so that a refused holder's whole transaction rolls back::

    import sqlalchemy as sa
    from tasklock.fencing.sqlalchemy import fence, fence_table, fenced_update, prune

    metadata = sa.MetaData()
    fences = fence_table(metadata)  # "tasklock_fence"; in your metadata, so Alembic sees it

    with engine.begin() as conn:
        fence(conn, fences, f"invoice:{invoice_id}", fence_token)  # StaleFence if stale
        conn.execute(sa.update(invoices).where(invoices.c.id == invoice_id).values(status="paid"))

    # Or a fence column on the protected row itself (no fence table):
    fenced_update(conn, invoices, invoices.c.id == invoice_id, fence_token, status="paid")

    prune(conn, fences, older_than=datetime.timedelta(days=7))

* :func:`fence` is one statement (the SQL of :mod:`tasklock.fencing.rules`, one copy shared with
  the Django form; MySQL adds a locking read of the stored token, and a refusal one read to name
  the newer token): it stores the token for the resource unless a higher one is stored, and takes
  that row's lock until your transaction ends, so writers of one resource are serialised and,
  once a token has written, no older one can. A token equal to the stored one is the same hold
  writing again: accepted. A lower one raises :class:`tasklock.StaleFence`; let it propagate out of
  ``engine.begin()`` (or ``session.begin()``) and everything the transaction wrote rolls back.
* :func:`fenced_update` needs no fence table: ``UPDATE ... SET <values>, fence = :token WHERE
  <where> AND (fence IS NULL OR fence <= :token)``. Each row is fenced on its own (meant for one
  row, by its key).
* :func:`prune` deletes fence rows not written for a while: the table grows by one row per
  resource ever fenced.
* ``async_fence``, ``async_fenced_update`` and ``async_prune`` are the same for an
  :class:`~sqlalchemy.ext.asyncio.AsyncConnection`. Every helper is written once, as a generator
  of statements; only running them (``conn.execute`` or ``await conn.execute``) differs.

With the ORM, pass ``session.connection()`` (``await session.connection()`` for an
``AsyncSession``): the fence then runs in the session's transaction.

Supported: PostgreSQL, SQLite 3.35+ and MySQL/MariaDB for :func:`fence` (``fenced_update`` works
on any database). Put the fence first in the transaction: on SQLite it then takes the write lock
before anything is read, and on MySQL's REPEATABLE READ the reads after it see the data as the
previous holder committed it (a snapshot taken earlier would not).

This module imports SQLAlchemy; ``import tasklock`` does not import this module.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect

from tasklock.errors import ConfigurationError, StaleFence
from tasklock.fencing import rules

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = [
    "async_fence",
    "async_fenced_update",
    "async_prune",
    "fence",
    "fence_table",
    "fenced_update",
    "prune",
]

T = TypeVar("T")

#: The columns :func:`fence` and :func:`prune` need, by name (the names are in the shared SQL).
FENCE_COLUMNS = ("resource", "token", "updated_at")
#: SQLite gained RETURNING (which tells an accepted upsert from a refused one) in 3.35.
SQLITE_MIN = (3, 35)


@dataclass(frozen=True)
class _Reply:
    """What a statement gave back: its rows (if it returns rows) and its rowcount."""

    rows: list[tuple[Any, ...]]
    rowcount: int


#: A statement to run and its parameters; the steps receive its :class:`_Reply`.
_Statement = tuple[sa.Executable, dict[str, Any] | None]
_Steps = Generator[_Statement, _Reply, T]


def _reply(result: sa.CursorResult[Any]) -> _Reply:
    rows = [tuple(row) for row in result.fetchall()] if result.returns_rows else []
    return _Reply(rows, result.rowcount)


def _run(conn: Connection, steps: _Steps[T]) -> T:
    try:
        statement = next(steps)
        while True:
            statement = steps.send(_reply(conn.execute(*statement)))
    except StopIteration as done:
        value: T = done.value
        return value


async def _run_async(conn: AsyncConnection, steps: _Steps[T]) -> T:
    try:
        statement = next(steps)
        while True:
            statement = steps.send(_reply(await conn.execute(*statement)))
    except StopIteration as done:
        value: T = done.value
        return value


# -- the table ---------------------------------------------------------------------------------


def fence_table(
    metadata: sa.MetaData, name: str = rules.DEFAULT_TABLE, *, schema: str | None = None
) -> sa.Table:
    """The fence table in ``metadata``: one row per resource, its newest token and when it was
    written. Being in your metadata, ``create_all`` and Alembic's autogenerate see it like any of
    your tables. Called again for the same metadata and name, returns the table already there."""
    key = f"{schema}.{name}" if schema else name
    existing = metadata.tables.get(key)
    if existing is not None:
        _fence_columns(existing)
        return existing
    return sa.Table(
        name,
        metadata,
        sa.Column("resource", sa.String(rules.MAX_RESOURCE), primary_key=True),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        schema=schema,
        comment="tasklock fencing: the newest lock token that wrote each resource",
    )


def _fence_columns(table: Any) -> dict[str, sa.Column[Any]]:
    """The fence table's columns by name, or a ConfigurationError saying what the table lacks
    (the shared SQL names them, and the upsert needs ``resource`` to be unique)."""
    if not isinstance(table, sa.Table):
        raise ConfigurationError(
            f"the fence table must be a sqlalchemy Table (fence_table(metadata)), got "
            f"{type(table).__name__}"
        )
    columns = {column.name: column for column in table.columns}
    missing = [name for name in FENCE_COLUMNS if name not in columns]
    if missing:
        raise ConfigurationError(
            f"table {table.fullname!r} is not a fence table: it has no {', '.join(missing)} "
            "column; a fence table needs resource (string, primary key), token (big integer) and "
            "updated_at (timestamp): make it with fence_table(metadata)"
        )
    resource = columns["resource"]
    if not (resource.primary_key or resource.unique):
        # Without a unique key MySQL's upsert inserts a second row instead of checking the first.
        raise ConfigurationError(
            f"table {table.fullname!r}: its resource column must be the primary key (or unique), "
            "or the upsert cannot find the stored token: make the table with fence_table(metadata)"
        )
    return columns


def _fence_dialect(dialect: Dialect, quoted: str) -> str:
    """The dialect's name, if the shared SQL supports it (ConfigurationError if not)."""
    rules.fence_sql(dialect.name, quoted)  # raises for a database the rules do not know
    if dialect.name == "sqlite":
        version = dialect.server_version_info
        if version is not None and tuple(version[:2]) < SQLITE_MIN:
            found = ".".join(str(part) for part in version)
            raise ConfigurationError(
                f"fencing needs SQLite 3.35 or later (RETURNING tells an accepted token from a "
                f"refused one), this Python's sqlite3 has SQLite {found}: upgrade SQLite, or use "
                "fenced_update (a fence column on the row itself)"
            )
    return dialect.name


def _statement(template: str, params: Mapping[str, Any], columns: Mapping[str, Any]) -> _Statement:
    """A rules template as a ``text()`` whose parameters have the table's column types (so a
    timestamp is stored as the column stores the others, e.g. SQLite's text form)."""
    clause = _clause(
        template, columns["resource"].type, columns["token"].type, columns["updated_at"].type
    )
    return clause, dict(params)


@functools.lru_cache(maxsize=256)
def _clause(template: str, resource_type: Any, token_type: Any, time_type: Any) -> Any:
    """The ``text()`` of a template with typed parameters, built once per template and table
    (building and parsing it again on every call cost as much as a round trip to SQLite)."""
    types = {"resource": resource_type, "token": token_type, "now": time_type, "before": time_type}
    sql, _ = rules.render(template, {}, "named")
    names = [name for name in types if f"{{{name}}}" in template]
    return sa.text(sql).bindparams(*(sa.bindparam(name, type_=types[name]) for name in names))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# -- fence -------------------------------------------------------------------------------------


def _fence_steps(dialect: Dialect, table: Any, resource: Any, token: Any) -> _Steps[None]:
    resource = rules.check_resource(resource)
    token = rules.check_token(token, resource)
    columns = _fence_columns(table)
    quoted = dialect.identifier_preparer.format_table(table)
    name = _fence_dialect(dialect, quoted)
    params = {"resource": resource, "token": token, "now": _now()}
    written = yield _statement(rules.fence_sql(name, quoted), params, columns)
    if name in rules.RETURNING_DIALECTS and written.rows:
        return  # the upsert returned the row: stored (or equal)
    # PostgreSQL/SQLite: no row back, refused; read the newer token to name it. MySQL: the upsert
    # says nothing either way; the stored token (a locking read) is ours if it was accepted.
    stored = yield _statement(rules.stored_sql(quoted, name), {"resource": resource}, columns)
    newer = stored.rows[0][0] if stored.rows else None
    if name in rules.UPSERT_DIALECTS and newer == token:
        return
    raise StaleFence(resource, token, None if newer is None else int(newer))


def fence(conn: Connection, table: sa.Table, resource: str, token: int | None) -> None:
    """Check ``token`` for ``resource`` in ``conn``'s transaction; :class:`tasklock.StaleFence`
    if a higher token has written it.

    Accepted (the token is the highest seen, or equal to it: the same hold again), the token is
    stored and the resource's row stays locked until the transaction ends, so another writer of
    the resource waits for this one to commit. Refused, it raises without changing anything:
    let the error leave the ``with engine.begin()`` block so the transaction rolls back with all
    it wrote. The first fence of a resource creates its row.

    ``table`` is :func:`fence_table`'s table; ``token`` the hold's (``lock.fence``,
    ``fence_token=`` in a task). ConfigurationError for a None token (an unfenced lock cannot be
    checked), a token that is not an int, an empty or over-long resource, a table without the
    fence columns, a connection that autocommits (the fence would guard nothing), or a database
    the shared SQL does not support (SQLite before 3.35 included).
    """
    _run(_in_transaction(_connection(conn)), _fence_steps(conn.dialect, table, resource, token))


async def async_fence(
    conn: AsyncConnection, table: sa.Table, resource: str, token: int | None
) -> None:
    """:func:`fence` on an :class:`~sqlalchemy.ext.asyncio.AsyncConnection`."""
    conn = _async_connection(conn)
    if conn.sync_connection is not None:
        _in_transaction(conn.sync_connection)
    await _run_async(conn, _fence_steps(conn.dialect, table, resource, token))


# -- fenced_update -----------------------------------------------------------------------------


def _update_steps(
    dialect: Dialect,
    table: Any,
    where: Any,
    token: Any,
    column: str,
    values: Mapping[str, Any],
) -> _Steps[int]:
    if not isinstance(table, sa.Table):
        hint = " (for a mapped class pass its __table__)" if hasattr(table, "__table__") else ""
        raise ConfigurationError(
            f"fenced_update needs a sqlalchemy Table{hint}, got {type(table).__name__}"
        )
    token = rules.check_token(token, table.fullname)
    if where is None or isinstance(where, bool):
        raise ConfigurationError(
            f"fenced_update on {table.fullname!r} needs a where clause naming the row(s), e.g. "
            "table.c.id == 42: fencing every row of a table at once is not what a fence is for"
        )
    fence_column = table.c.get(column)
    if fence_column is None:
        raise ConfigurationError(
            f"table {table.fullname!r} has no fence column {column!r}: add a nullable BigInteger "
            f"column {column!r} to it (sa.Column({column!r}, sa.BigInteger, nullable=True)), or "
            "name yours with column="
        )
    if fence_column.key in values:
        raise ConfigurationError(
            f"fenced_update sets the fence column {column!r} itself (to the token); do not pass "
            "it among the values"
        )
    unknown = sorted(key for key in values if key not in table.c)
    if unknown:
        raise ConfigurationError(
            f"table {table.fullname!r} has no column {', '.join(map(repr, unknown))} to set"
        )
    newest = sa.or_(fence_column.is_(None), fence_column <= token)
    update = sa.update(table).where(where, newest).values({**values, fence_column.key: token})
    updated = yield update, None
    if updated.rowcount:
        return updated.rowcount
    # Nothing changed: no such row, or a newer token has written it. A locking read, so that a
    # REPEATABLE READ snapshot (MySQL's default) cannot hide the newer token.
    seen = yield sa.select(fence_column).where(where).with_for_update(), None
    fences = [row[0] for row in seen.rows if row[0] is not None]
    newer = max(fences, default=None)
    if newer is not None and newer > token:
        raise StaleFence(_describe(dialect, table, where), token, int(newer))
    return 0


def _describe(dialect: Dialect, table: sa.Table, where: Any) -> str:
    """The rows a fenced update named, readably: ``invoices where invoices.id = 42``."""
    try:
        text = str(where.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    except Exception:  # a value with no literal form: the clause with its placeholders
        text = str(where)
    return f"{table.fullname} where {text}"


def fenced_update(
    conn: Connection,
    table: sa.Table,
    where: sa.ColumnElement[bool],
    token: int | None,
    /,
    *,
    column: str = "fence",
    **values: Any,
) -> int:
    """``UPDATE table SET <values>, <column> = token WHERE <where> AND (<column> IS NULL OR
    <column> <= token)``: the fence on the protected row itself, no fence table needed.

    Returns how many rows changed. None changed and a matching row has a higher fence: a newer
    holder wrote it, :class:`tasklock.StaleFence` (``resource`` names the table and the where
    clause); roll back. No row matches at all: 0, as a plain UPDATE would. An equal fence is
    accepted (the same hold again). Each matching row is fenced on its own; it is meant for one
    row, named by its key.

    ``column`` is the fence column's key (a nullable BigInteger; NULL means never fenced);
    ``values`` the columns to set, by key. Works on any database SQLAlchemy supports.
    ConfigurationError for a bad token, a missing where clause, a missing fence column, or a
    value for a column the table does not have.
    """
    return _run(_connection(conn), _update_steps(conn.dialect, table, where, token, column, values))


async def async_fenced_update(
    conn: AsyncConnection,
    table: sa.Table,
    where: sa.ColumnElement[bool],
    token: int | None,
    /,
    *,
    column: str = "fence",
    **values: Any,
) -> int:
    """:func:`fenced_update` on an :class:`~sqlalchemy.ext.asyncio.AsyncConnection`."""
    return await _run_async(
        _async_connection(conn), _update_steps(conn.dialect, table, where, token, column, values)
    )


# -- prune -------------------------------------------------------------------------------------


def _prune_steps(dialect: Dialect, table: Any, older_than: Any) -> _Steps[int]:
    if not isinstance(older_than, datetime.timedelta) or older_than <= datetime.timedelta(0):
        raise ConfigurationError(
            f"older_than must be a positive datetime.timedelta (e.g. timedelta(days=7)), got "
            f"{older_than!r}"
        )
    columns = _fence_columns(table)
    quoted = dialect.identifier_preparer.format_table(table)
    before = _now() - older_than
    deleted = yield _statement(rules.prune_sql(quoted), {"before": before}, columns)
    return max(deleted.rowcount, 0)


def prune(conn: Connection, table: sa.Table, *, older_than: datetime.timedelta) -> int:
    """Delete the fence rows not written for ``older_than``; returns how many.

    A pruned resource accepts any token again (its next fence creates its row afresh), so choose
    ``older_than`` far longer than any hold could last, paused holders included: days, not
    seconds.
    """
    return _run(_connection(conn), _prune_steps(conn.dialect, table, older_than))


async def async_prune(
    conn: AsyncConnection, table: sa.Table, *, older_than: datetime.timedelta
) -> int:
    """:func:`prune` on an :class:`~sqlalchemy.ext.asyncio.AsyncConnection`."""
    return await _run_async(_async_connection(conn), _prune_steps(conn.dialect, table, older_than))


# -- connections -------------------------------------------------------------------------------


def _connection(conn: Any) -> Connection:
    if isinstance(conn, Connection):
        return conn
    raise ConfigurationError(_not_a_connection(conn, "Connection", "engine.begin()", ""))


def _in_transaction(conn: Connection) -> Connection:
    """``conn``, unless it autocommits: each statement would then commit on its own, and the
    fence row's lock would end before the write it guards began."""
    autocommit = getattr(conn, "_is_autocommit_isolation", None)  # SQLAlchemy's own test
    if autocommit is not None and autocommit():
        raise ConfigurationError(
            "fence() needs a transaction, and this connection autocommits "
            "(isolation_level='AUTOCOMMIT'): the fence would commit at once and guard nothing. "
            "Use a connection in a transaction (engine.begin()), or fenced_update, which is a "
            "single statement"
        )
    return conn


def _async_connection(conn: Any) -> AsyncConnection:
    from sqlalchemy.ext.asyncio import AsyncConnection

    if isinstance(conn, AsyncConnection):
        return conn
    raise ConfigurationError(
        _not_a_connection(conn, "AsyncConnection", "async with engine.begin()", "await ")
    )


def _not_a_connection(conn: Any, wanted: str, begin: str, awaiting: str) -> str:
    return (
        f"pass a sqlalchemy {wanted} ({begin} as conn; for an ORM session, "
        f"{awaiting}session.connection()) so the fence runs in its transaction, got "
        f"{type(conn).__name__}"
    )
