"""tasklock.fencing.sqlalchemy on real databases: PostgreSQL (pgserver), SQLite (a file) and
MariaDB (the suite's own, see ``tests/support/databases.py``), each test on each of them.

Accepted, equal and refused tokens; a refused writer's transaction rolls back with all it wrote;
fenced_update on a fence column; prune; the errors for bad inputs; two writers of one resource
serialised on the fence row (the second is seen waiting for the first's lock, read live from the
database's own lock views where it has them: pg_locks, SHOW ENGINE INNODB STATUS); a REPEATABLE
READ snapshot cannot hide a newer token; the ORM; and the asyncio forms on PostgreSQL (psycopg)
and SQLite (aiosqlite).
"""

from __future__ import annotations

import datetime
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session

from tasklock import ConfigurationError, StaleFence
from tasklock.fencing.sqlalchemy import (
    async_fence,
    async_fenced_update,
    async_prune,
    fence,
    fence_table,
    fenced_update,
    prune,
)
from tests.support.databases import Postgres
from tests.support.polling import eventually, holds_for

metadata = sa.MetaData()
fences = fence_table(metadata)
invoices = sa.Table(
    "invoices",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("amount", sa.Integer, nullable=False, server_default="0"),
    sa.Column("fence", sa.BigInteger, nullable=True),
    sa.Column("version", sa.BigInteger, nullable=True),
)
ledger = sa.Table(
    "ledger",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("note", sa.String(100), nullable=False),
)


class Base(DeclarativeBase):
    metadata = metadata


class Invoice(Base):
    __table__ = invoices
    id: Mapped[int]
    status: Mapped[str]


BACKENDS = ["postgresql", "sqlite", "mariadb"]


# -- engines -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pg_engine(postgres: Postgres) -> Iterator[sa.Engine]:
    engine = sa.create_engine(postgres.sqlalchemy_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def mariadb_engine(mysql_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(mysql_url)
    yield engine
    engine.dispose()


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    """The backend's engine with fresh tables (dropped after the test)."""
    sqlite = request.param == "sqlite"
    engine: sa.Engine
    if sqlite:  # a file, so that two connections are two writers
        url = f"sqlite:///{tmp_path / 'fence.db'}"
        engine = sa.create_engine(url, connect_args={"check_same_thread": False})
    else:
        engine = request.getfixturevalue(
            "pg_engine" if request.param == "postgresql" else "mariadb_engine"
        )
    metadata.create_all(engine)
    try:
        yield engine
    finally:
        metadata.drop_all(engine)
        if sqlite:
            engine.dispose()


def stored(engine: sa.Engine, resource: str) -> int | None:
    with engine.connect() as conn:
        token: int | None = conn.scalar(
            sa.select(fences.c.token).where(fences.c.resource == resource)
        )
        return token


def notes(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.scalars(sa.select(ledger.c.note).order_by(ledger.c.id)))


def fenced(engine: sa.Engine, resource: str, token: int) -> None:
    with engine.begin() as conn:
        fence(conn, fences, resource, token)


def add_invoice(engine: sa.Engine, id_: int, fence_: int | None = None) -> None:
    with engine.begin() as conn:
        conn.execute(invoices.insert().values(id=id_, status="new", fence=fence_))


def invoice(engine: sa.Engine, id_: int) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(invoices).where(invoices.c.id == id_)).one()._mapping)


# -- fence -------------------------------------------------------------------------------------


def test_the_first_fence_creates_the_row_and_higher_tokens_advance_it(engine: sa.Engine) -> None:
    before = datetime.datetime.now(datetime.UTC)
    assert stored(engine, "invoice:1") is None
    fenced(engine, "invoice:1", 5)
    assert stored(engine, "invoice:1") == 5
    with engine.connect() as conn:
        written = conn.scalar(sa.select(fences.c.updated_at))
    assert written is not None
    if written.tzinfo is None:  # SQLite and MySQL keep the UTC wall time without a zone
        written = written.replace(tzinfo=datetime.UTC)
    assert written >= before.replace(microsecond=0)
    fenced(engine, "invoice:1", 9)
    assert stored(engine, "invoice:1") == 9
    fenced(engine, "invoice:2", 1)  # resources are independent
    assert (stored(engine, "invoice:1"), stored(engine, "invoice:2")) == (9, 1)


def test_an_equal_token_is_the_same_hold_and_is_accepted(engine: sa.Engine) -> None:
    fenced(engine, "invoice:1", 7)
    fenced(engine, "invoice:1", 7)
    with engine.begin() as conn:  # twice in one transaction too
        fence(conn, fences, "invoice:1", 7)
        fence(conn, fences, "invoice:1", 7)
    assert stored(engine, "invoice:1") == 7


def test_an_older_token_is_refused_and_its_transaction_rolls_back(engine: sa.Engine) -> None:
    fenced(engine, "invoice:1", 7)
    add_invoice(engine, 1)

    def stale_writer() -> None:
        with engine.begin() as conn:
            conn.execute(ledger.insert().values(note="stale writer"))
            conn.execute(sa.update(invoices).where(invoices.c.id == 1).values(status="paid"))
            fence(conn, fences, "invoice:1", 6)

    with pytest.raises(StaleFence) as refused:
        stale_writer()
    assert (refused.value.resource, refused.value.token, refused.value.newer) == ("invoice:1", 6, 7)
    assert "token 6 was refused, token 7 is newer" in str(refused.value)
    assert notes(engine) == []
    assert invoice(engine, 1)["status"] == "new"
    assert stored(engine, "invoice:1") == 7


def test_a_read_earlier_in_the_transaction_does_not_hide_a_newer_token(engine: sa.Engine) -> None:
    # MySQL's REPEATABLE READ: a transaction that has read keeps its snapshot; the fence must still
    # see the token a newer holder committed since (a plain read-back would see the old one).
    fenced(engine, "invoice:1", 5)
    add_invoice(engine, 1, fence_=5)
    with engine.connect() as stale:
        stale.execute(sa.select(ledger)).all()  # the snapshot (MySQL) starts here
        stale.execute(sa.select(invoices)).all()
        fenced(engine, "invoice:1", 6)
        with engine.begin() as conn:
            assert fenced_update(conn, invoices, invoices.c.id == 1, 6, status="newer") == 1
        with pytest.raises(StaleFence) as refused:
            fence(stale, fences, "invoice:1", 5)
        assert refused.value.newer == 6
        with pytest.raises(StaleFence) as refused:
            fenced_update(stale, invoices, invoices.c.id == 1, 5, status="stale")
        assert refused.value.newer == 6
        stale.rollback()
    assert invoice(engine, 1)["status"] == "newer"


# -- fenced_update -----------------------------------------------------------------------------


def test_fenced_update_writes_with_a_current_token(engine: sa.Engine) -> None:
    add_invoice(engine, 1)  # fence NULL: never fenced
    with engine.begin() as conn:
        assert fenced_update(conn, invoices, invoices.c.id == 1, 3, status="sent", amount=10) == 1
    assert invoice(engine, 1) == {
        "id": 1,
        "status": "sent",
        "amount": 10,
        "fence": 3,
        "version": None,
    }
    with engine.begin() as conn:  # equal: the same hold again
        assert fenced_update(conn, invoices, invoices.c.id == 1, 3, status="sent twice") == 1
    with engine.begin() as conn:
        assert fenced_update(conn, invoices, invoices.c.id == 1, 4, status="paid") == 1
    assert (invoice(engine, 1)["status"], invoice(engine, 1)["fence"]) == ("paid", 4)


def test_fenced_update_refuses_an_older_token_and_rolls_back(engine: sa.Engine) -> None:
    add_invoice(engine, 1, fence_=8)

    def stale_writer() -> None:
        with engine.begin() as conn:
            conn.execute(ledger.insert().values(note="stale writer"))
            fenced_update(conn, invoices, invoices.c.id == 1, 7, status="stale")

    with pytest.raises(StaleFence) as refused:
        stale_writer()
    assert (refused.value.token, refused.value.newer) == (7, 8)
    assert refused.value.resource == "invoices where invoices.id = 1"
    assert invoice(engine, 1)["status"] == "new"
    assert notes(engine) == []


def test_fenced_update_of_no_row_returns_0(engine: sa.Engine) -> None:
    add_invoice(engine, 1, fence_=8)
    with engine.begin() as conn:
        assert fenced_update(conn, invoices, invoices.c.id == 2, 3, status="x") == 0
        # A where that matches nothing of the fenced row either: 0, not stale.
        where = sa.and_(invoices.c.id == 1, invoices.c.status == "paid")
        assert fenced_update(conn, invoices, where, 3, status="x") == 0


def test_fenced_update_on_a_column_of_another_name(engine: sa.Engine) -> None:
    add_invoice(engine, 1, fence_=100)  # the "fence" column is not the one used here
    with engine.begin() as conn:
        assert (
            fenced_update(conn, invoices, invoices.c.id == 1, 2, column="version", status="a") == 1
        )
    with pytest.raises(StaleFence) as refused, engine.begin() as conn:
        fenced_update(conn, invoices, invoices.c.id == 1, 1, column="version", status="b")
    assert refused.value.newer == 2
    assert (invoice(engine, 1)["status"], invoice(engine, 1)["fence"]) == ("a", 100)


# -- prune -------------------------------------------------------------------------------------


def test_prune_deletes_the_rows_not_written_for_a_while(engine: sa.Engine) -> None:
    for resource in ("old:1", "old:2", "recent"):
        fenced(engine, resource, 5)
    ten_days_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
    with engine.begin() as conn:
        conn.execute(
            sa.update(fences)
            .where(fences.c.resource.in_(["old:1", "old:2"]))
            .values(updated_at=ten_days_ago)
        )
    with engine.begin() as conn:
        assert prune(conn, fences, older_than=datetime.timedelta(days=7)) == 2
    with engine.begin() as conn:
        assert prune(conn, fences, older_than=datetime.timedelta(days=7)) == 0
    with engine.connect() as conn:
        assert list(conn.scalars(sa.select(fences.c.resource))) == ["recent"]
    # What the docstring warns about: a pruned resource accepts any token again.
    fenced(engine, "old:1", 1)
    assert stored(engine, "old:1") == 1


# -- bad inputs --------------------------------------------------------------------------------


BAD_CALLS: dict[str, tuple[Callable[[sa.Connection], object], str]] = {
    "None token": (lambda c: fence(c, fences, "r", None), "is None"),
    "bool token": (lambda c: fence(c, fences, "r", True), "must be an int"),
    "str token": (lambda c: fence(c, fences, "r", "5"), "must be an int"),  # type: ignore[arg-type]
    "negative token": (lambda c: fence(c, fences, "r", -1), "signed 64-bit"),
    "token past 64 bits": (lambda c: fence(c, fences, "r", 2**63), "signed 64-bit"),
    "empty resource": (lambda c: fence(c, fences, "", 1), "non-empty string"),
    "resource not a str": (lambda c: fence(c, fences, 42, 1), "non-empty string"),  # type: ignore[arg-type]
    "too long resource": (lambda c: fence(c, fences, "x" * 256, 1), "at most 255"),
    "not a fence table": (
        lambda c: fence(c, invoices, "r", 1),
        "'invoices' is not a fence table: it has no resource, token, updated_at column",
    ),
    "not a table": (lambda c: fence(c, "tasklock_fence", "r", 1), "must be a sqlalchemy Table"),  # type: ignore[arg-type]
    "no fence column": (
        lambda c: fenced_update(c, ledger, ledger.c.id == 1, 1, note="x"),
        "table 'ledger' has no fence column 'fence'",
    ),
    "fenced_update column= missing": (
        lambda c: fenced_update(c, invoices, invoices.c.id == 1, 1, column="epoch", status="x"),
        "has no fence column 'epoch'",
    ),
    "fenced_update None token": (
        lambda c: fenced_update(c, invoices, invoices.c.id == 1, None, status="x"),
        "is None",
    ),
    "fenced_update without where": (
        lambda c: fenced_update(c, invoices, None, 1, status="x"),  # type: ignore[arg-type]
        "needs a where clause",
    ),
    "fenced_update unknown value": (
        lambda c: fenced_update(c, invoices, invoices.c.id == 1, 1, colour="red"),
        "has no column 'colour' to set",
    ),
    "fenced_update sets the fence": (
        lambda c: fenced_update(c, invoices, invoices.c.id == 1, 1, fence=3),
        "do not pass it among the values",
    ),
    "fenced_update mapped class": (
        lambda c: fenced_update(c, Invoice, Invoice.id == 1, 1, status="x"),  # type: ignore[arg-type]
        "pass its __table__",
    ),
    "prune older_than number": (
        lambda c: prune(c, fences, older_than=7),  # type: ignore[arg-type]
        "positive datetime.timedelta",
    ),
    "prune older_than zero": (
        lambda c: prune(c, fences, older_than=datetime.timedelta(0)),
        "positive datetime.timedelta",
    ),
    "prune not a fence table": (
        lambda c: prune(c, ledger, older_than=datetime.timedelta(days=1)),
        "'ledger' is not a fence table",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_inputs_are_configuration_errors(engine: sa.Engine, case: str) -> None:
    call, message = BAD_CALLS[case]
    add_invoice(engine, 1)
    with engine.begin() as conn, pytest.raises(ConfigurationError, match=re.escape(message)):
        call(conn)
    assert invoice(engine, 1)["status"] == "new"
    with engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(fences)) == 0


def test_a_session_instead_of_its_connection_is_named(engine: sa.Engine) -> None:
    with Session(engine) as session, pytest.raises(ConfigurationError, match="session.connection"):
        fence(session, fences, "r", 1)  # type: ignore[arg-type]


def test_an_autocommit_connection_is_refused(engine: sa.Engine) -> None:
    # Each statement would commit by itself: the fence's row lock would be gone before the write.
    with engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(ConfigurationError, match="autocommits"):
            fence(auto, fences, "r", 1)
        # fenced_update is one statement: it needs no transaction.
        auto.execute(invoices.insert().values(id=1, status="new"))
        assert fenced_update(auto, invoices, invoices.c.id == 1, 1, status="x") == 1
    assert stored(engine, "r") is None


def test_a_resource_column_that_is_not_unique_is_refused() -> None:
    loose = sa.Table(
        "loose_fence",
        sa.MetaData(),
        sa.Column("resource", sa.String(255)),
        sa.Column("token", sa.BigInteger),
        sa.Column("updated_at", sa.DateTime),
    )
    engine = sa.create_engine("sqlite://")
    with engine.connect() as conn, pytest.raises(ConfigurationError, match="primary key"):
        fence(conn, loose, "r", 1)


def test_sqlite_older_than_3_35_is_refused(tmp_path: Path) -> None:
    # This machine's SQLite is newer; the dialect reports the version of the library it loaded,
    # and an older one (no RETURNING) must be refused with a fix, not fail on a syntax error.
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    metadata.create_all(engine)
    with engine.connect() as conn:
        engine.dialect.server_version_info = (3, 34, 1)
        with pytest.raises(ConfigurationError, match=r"SQLite 3\.35 or later.*SQLite 3\.34\.1"):
            fence(conn, fences, "r", 1)
        # fenced_update needs no RETURNING: it still works there.
        conn.execute(invoices.insert().values(id=1, status="new"))
        assert fenced_update(conn, invoices, invoices.c.id == 1, 1, status="x") == 1
    engine.dispose()


def test_fence_table_is_in_the_metadata_under_its_name() -> None:
    own = sa.MetaData()
    table = fence_table(own, name="locks_fence", schema=None)
    assert own.tables["locks_fence"] is table
    assert fence_table(own, name="locks_fence") is table  # again: the same table
    assert [c.name for c in table.primary_key.columns] == ["resource"]
    assert isinstance(table.c.resource.type, sa.String)
    assert table.c.resource.type.length == 255
    assert isinstance(table.c.token.type, sa.BigInteger)
    assert not table.c.token.nullable
    updated_at = table.c.updated_at.type
    assert isinstance(updated_at, sa.DateTime)
    assert updated_at.timezone
    assert not table.c.updated_at.nullable
    assert fences.name == "tasklock_fence"


def test_a_fence_table_of_another_name_works(engine: sa.Engine) -> None:
    own = sa.MetaData()
    table = fence_table(own, name="other_fence")
    own.create_all(engine)
    try:
        with engine.begin() as conn:
            fence(conn, table, "r", 2)
        with pytest.raises(StaleFence), engine.begin() as conn:
            fence(conn, table, "r", 1)
        assert stored(engine, "r") is None  # not in the default table
    finally:
        own.drop_all(engine)


# -- two writers of one resource ---------------------------------------------------------------


def _waiting_probe(engine: sa.Engine, session_id: int | None) -> Callable[[], bool]:
    """True once the database shows that session waiting for the fence row's lock, read live on
    every call: PostgreSQL's pg_locks; for InnoDB the TRANSACTIONS part of SHOW ENGINE INNODB
    STATUS, built afresh for each call. Not information_schema.innodb_trx: InnoDB fills it from
    a buffer that is refreshed only when nobody has read it for 0.1 s, so a probe polling it
    more often than that kept the snapshot it first read (the previous test's transactions, or
    this one's before the second writer waited) for good. SQLite shows nothing of the kind."""
    if engine.dialect.name == "postgresql":

        def waiting() -> bool:
            sql = "SELECT count(*) FROM pg_locks WHERE pid = :id AND NOT granted"
            with engine.connect() as conn:
                return bool(conn.scalar(sa.text(sql), {"id": session_id}))

        return waiting

    def innodb_waiting() -> bool:
        with engine.connect() as conn:
            status = str(conn.exec_driver_sql("SHOW ENGINE INNODB STATUS").one()[2])
        return _innodb_waits_for_fence_row(status, session_id)

    return innodb_waiting


#: In SHOW ENGINE INNODB STATUS, a transaction that waits for a row lock of the fence table.
_INNODB_FENCE_WAIT = re.compile(
    r"^------- TRX HAS BEEN WAITING .*\nRECORD LOCKS .* of table `[^`]*`\.`tasklock_fence` ",
    re.MULTILINE,
)


def _innodb_waits_for_fence_row(status: str, session_id: int | None) -> bool:
    """Whether the transaction of connection ``session_id`` (MariaDB's or MySQL's "thread id")
    is waiting for a lock on a row of the fence table, in SHOW ENGINE INNODB STATUS's text."""
    for transaction in status.split("\n---TRANSACTION ")[1:]:
        thread = re.search(r"^(?:MariaDB|MySQL) thread id (\d+),", transaction, re.MULTILINE)
        if thread is not None and int(thread.group(1)) == session_id:
            return _INNODB_FENCE_WAIT.search(transaction) is not None
    return False


def _session_id(conn: sa.Connection) -> int | None:
    name = conn.dialect.name
    if name == "sqlite":
        return None
    value = conn.exec_driver_sql(
        "SELECT pg_backend_pid()" if name == "postgresql" else "SELECT CONNECTION_ID()"
    ).scalar()
    conn.commit()
    return int(value) if value is not None else None


@pytest.mark.parametrize(("first_token", "second_token"), [(1, 2), (2, 1)], ids=["newer", "older"])
def test_a_second_writer_waits_for_the_first_to_commit(
    engine: sa.Engine, first_token: int, second_token: int
) -> None:
    first_fenced, finish_first, first_committing = (
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    second_ready, second_done = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def first() -> None:
        with engine.begin() as conn:
            fence(conn, fences, "invoice:1", first_token)
            conn.execute(ledger.insert().values(note="first"))
            first_fenced.set()
            assert finish_first.wait(30)
            first_committing.set()  # set before the commit: the second may not pass before this
        seen["first"] = "committed"

    def second() -> None:
        try:
            with engine.connect() as conn:
                seen["session"] = _session_id(conn)
                with conn.begin():
                    second_ready.set()
                    fence(conn, fences, "invoice:1", second_token)
                    seen["passed after first committed"] = first_committing.is_set()
                    conn.execute(ledger.insert().values(note="second"))
            seen["second"] = "committed"
        except StaleFence as exc:
            seen["passed after first committed"] = first_committing.is_set()
            seen["second"] = exc
        finally:
            second_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    try:
        assert first_fenced.wait(30)
        threads[1].start()
        assert second_ready.wait(30)
        if engine.dialect.name == "sqlite":
            # SQLite's lock wait is inside the driver's busy handler, invisible from outside.
            holds_for(lambda: not second_done.is_set(), 0.3, what="the second writer waits")
        else:
            waiting = _waiting_probe(engine, seen["session"])
            # Done instead of waiting ends the polling at once, and the assertion says what it did.
            eventually(
                lambda: second_done.is_set() or waiting(),
                timeout=20,
                what=f"the second writer (connection {seen['session']}) waits for the fence row",
            )
        assert not second_done.is_set(), f"the second writer did not wait for the first: {seen}"
    finally:
        finish_first.set()
        for thread in threads:
            thread.join(30)
    assert seen["first"] == "committed"
    assert seen["passed after first committed"] is True
    if second_token > first_token:
        assert seen["second"] == "committed"
        assert notes(engine) == ["first", "second"]
    else:
        refused = seen["second"]
        assert isinstance(refused, StaleFence)
        assert (refused.token, refused.newer) == (1, 2)
        assert notes(engine) == ["first"]
    assert stored(engine, "invoice:1") == max(first_token, second_token)


# -- the ORM -----------------------------------------------------------------------------------


def test_an_orm_session_fences_through_its_connection(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        fence(session.connection(), fences, "invoice:1", 4)
        session.add(Invoice(id=1, status="new"))

    def stale_writer() -> None:
        with Session(engine) as session, session.begin():
            session.add(Invoice(id=2, status="new"))
            session.get_one(Invoice, 1).status = "stale"
            session.flush()
            fence(session.connection(), fences, "invoice:1", 3)

    with pytest.raises(StaleFence):
        stale_writer()
    with Session(engine) as session:
        assert [(i.id, i.status) for i in session.scalars(sa.select(Invoice))] == [(1, "new")]
    with Session(engine) as session, session.begin():
        conn = session.connection()
        assert fenced_update(conn, Invoice.__table__, Invoice.id == 1, 4, status="paid") == 1
    with Session(engine) as session:
        assert session.get_one(Invoice, 1).status == "paid"


# -- asyncio -----------------------------------------------------------------------------------


@pytest.fixture(params=["postgresql", "sqlite"])
async def async_engine(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[AsyncEngine]:
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres").sqlalchemy_url
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'fence.db'}"
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    yield engine
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
    await engine.dispose()


async def async_stored(engine: AsyncEngine, resource: str) -> int | None:
    async with engine.connect() as conn:
        token: int | None = await conn.scalar(
            sa.select(fences.c.token).where(fences.c.resource == resource)
        )
        return token


async def test_async_fence(async_engine: AsyncEngine) -> None:
    assert async_engine.dialect.name in ("postgresql", "sqlite")
    async with async_engine.begin() as conn:
        await async_fence(conn, fences, "invoice:1", 5)
    async with async_engine.begin() as conn:
        await async_fence(conn, fences, "invoice:1", 5)

    async def stale_writer() -> None:
        async with async_engine.begin() as conn:
            await conn.execute(ledger.insert().values(note="stale writer"))
            await async_fence(conn, fences, "invoice:1", 4)

    with pytest.raises(StaleFence) as refused:
        await stale_writer()
    assert (refused.value.resource, refused.value.token, refused.value.newer) == ("invoice:1", 4, 5)
    async with async_engine.connect() as conn:
        assert (await conn.scalars(sa.select(ledger.c.note))).all() == []
    assert await async_stored(async_engine, "invoice:1") == 5
    async with async_engine.begin() as conn:
        with pytest.raises(ConfigurationError, match="is None"):
            await async_fence(conn, fences, "invoice:1", None)
        with pytest.raises(ConfigurationError, match="'ledger' is not a fence table"):
            await async_fence(conn, ledger, "invoice:1", 6)


async def test_async_fenced_update(async_engine: AsyncEngine) -> None:
    async with async_engine.begin() as conn:
        await conn.execute(invoices.insert().values(id=1, status="new"))
        assert await async_fenced_update(conn, invoices, invoices.c.id == 1, 3, status="a") == 1
        assert await async_fenced_update(conn, invoices, invoices.c.id == 1, 3, status="b") == 1
        assert await async_fenced_update(conn, invoices, invoices.c.id == 2, 3, status="c") == 0
    with pytest.raises(StaleFence) as refused:
        async with async_engine.begin() as conn:
            await async_fenced_update(conn, invoices, invoices.c.id == 1, 2, status="stale")
    assert refused.value.newer == 3
    async with async_engine.connect() as conn:
        row = (await conn.execute(sa.select(invoices.c.status, invoices.c.fence))).one()
    assert tuple(row) == ("b", 3)


async def test_async_prune(async_engine: AsyncEngine) -> None:
    async with async_engine.begin() as conn:
        await async_fence(conn, fences, "old", 1)
        await async_fence(conn, fences, "recent", 1)
        await conn.execute(
            sa.update(fences)
            .where(fences.c.resource == "old")
            .values(updated_at=datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2))
        )
    async with async_engine.begin() as conn:
        assert await async_prune(conn, fences, older_than=datetime.timedelta(days=1)) == 1
    assert await async_stored(async_engine, "old") is None
    assert await async_stored(async_engine, "recent") == 1


async def test_async_fence_refuses_an_autocommit_connection(async_engine: AsyncEngine) -> None:
    async with async_engine.connect() as conn:
        auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(ConfigurationError, match="autocommits"):
            await async_fence(auto, fences, "r", 1)


async def test_async_forms_want_an_async_connection(async_engine: AsyncEngine) -> None:
    async with async_engine.connect() as conn:
        with pytest.raises(ConfigurationError, match="AsyncConnection"):
            await async_fence(conn.sync_connection, fences, "r", 1)  # type: ignore[arg-type]
