"""Fencing for Django (``tasklock.django.fencing``) against real databases: PostgreSQL (pgserver,
one per module), a SQLite file, and the suite's MariaDB (``tests/support/databases.py``: skipped,
naming the install line, only where MariaDB is not installed).

Each database gets its own alias beside the test project's in-memory ``default``, migrated as a
project would (``migrate``: the app's migration creates ``tasklock_fence``). The tests cover the
table form (``fence()``: newer, equal, stale with the atomic block rolled back, concurrent
writers), the column form (``fenced_update``), the prune command, the migration itself, the
errors, and a view driven through Django's test client against PostgreSQL.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, transaction
from django.test import Client, override_settings
from django.utils import timezone

from tasklock import StaleFence
from tasklock.errors import ConfigurationError
from tests.support.databases import MariaDB, start_postgres
from tests.support.django_databases import django_database, mariadb_database

# pgserver's platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers): nothing to act on.
pytestmark = pytest.mark.filterwarnings("ignore:XDG_RUNTIME_DIR is not set")

DATABASES = ["postgresql", "sqlite", "mariadb"]
PRUNE = "tasklock_prune_fences"


@pytest.fixture(scope="module", autouse=True)
def django_project() -> None:
    from tests.django_project import setup

    setup()


@pytest.fixture(scope="module")
def postgresql_alias() -> Iterator[str]:
    with start_postgres() as server, django_database("fence_pg", server.django_database()) as alias:
        yield alias


@pytest.fixture(scope="module")
def sqlite_alias(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("fence-sqlite") / "db.sqlite3"
    entry = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}
    with django_database("fence_sqlite", entry) as alias:
        yield alias


@pytest.fixture(scope="module")
def mariadb_alias(mariadb: MariaDB) -> Iterator[str]:
    with (
        mariadb_database(mariadb.host, mariadb.port) as entry,
        django_database("fence_mariadb", entry) as alias,
    ):
        yield alias


@pytest.fixture(params=DATABASES)
def db(request: pytest.FixtureRequest) -> str:
    """A migrated database alias with empty tables."""
    from tasklock.django.models import Fence
    from tests.django_project.shop.models import Invoice

    alias: str = request.getfixturevalue(f"{request.param}_alias")
    Fence.objects.using(alias).all().delete()
    Invoice.objects.using(alias).all().delete()
    return alias


def stored(alias: str, resource: str) -> int | None:
    from tasklock.django.models import Fence

    row = Fence.objects.using(alias).filter(pk=resource).first()
    return None if row is None else row.token


def fence_in_transaction(alias: str, resource: str, token: Any) -> None:
    from tasklock.django.fencing import fence

    with transaction.atomic(using=alias):
        fence(resource, token, using=alias)


def new_invoice(alias: str, **fields: Any) -> Any:
    from tests.django_project.shop.models import Invoice

    return Invoice.objects.using(alias).create(**fields)


def reload(alias: str, invoice: Any) -> Any:
    return type(invoice).objects.using(alias).get(pk=invoice.pk)


# -- fence(): the table of tokens -----------------------------------------------------------------


def test_first_and_newer_tokens_are_accepted(db: str) -> None:
    before = timezone.now()
    fence_in_transaction(db, "invoice:1", 5)
    assert stored(db, "invoice:1") == 5
    fence_in_transaction(db, "invoice:1", 9)
    assert stored(db, "invoice:1") == 9
    fence_in_transaction(db, "invoice:2", 1)  # resources are fenced apart
    assert stored(db, "invoice:2") == 1
    from tasklock.django.models import Fence

    row = Fence.objects.using(db).get(pk="invoice:1")
    assert timezone.is_aware(row.updated_at)
    assert before - timedelta(seconds=5) <= row.updated_at <= timezone.now() + timedelta(seconds=5)


def test_equal_token_is_the_same_hold_and_accepted(db: str) -> None:
    from tasklock.django.fencing import fence
    from tasklock.django.models import Fence

    fence_in_transaction(db, "invoice:1", 7)
    rows = Fence.objects.using(db).filter(pk="invoice:1")
    rows.update(updated_at=timezone.now() - timedelta(days=1))
    fence_in_transaction(db, "invoice:1", 7)
    # Accepted as a write: the row records it (updated_at is the last accepted write).
    assert rows.get().updated_at > timezone.now() - timedelta(minutes=5)
    with transaction.atomic(using=db):  # twice in one transaction, too
        fence("invoice:1", 7, using=db)
        fence("invoice:1", 7, using=db)
    assert stored(db, "invoice:1") == 7


def test_largest_token_fits(db: str) -> None:
    fence_in_transaction(db, "invoice:1", 2**63 - 2)
    fence_in_transaction(db, "invoice:1", 2**63 - 1)
    assert stored(db, "invoice:1") == 2**63 - 1
    with pytest.raises(StaleFence):
        fence_in_transaction(db, "invoice:1", 2**63 - 2)


def test_stale_token_rolls_the_block_back(db: str) -> None:
    from tasklock.django.fencing import fence

    invoice = new_invoice(db)
    fence_in_transaction(db, "invoice:1", 8)

    def write_then_fence() -> None:
        with transaction.atomic(using=db):
            type(invoice).objects.using(db).filter(pk=invoice.pk).update(status="paid", paid_by=7)
            new_invoice(db, status="stale writer")
            fence("invoice:1", 7, using=db)

    with pytest.raises(StaleFence) as raised:
        write_then_fence()
    assert (raised.value.resource, raised.value.token, raised.value.newer) == ("invoice:1", 7, 8)
    assert "invoice:1" in str(raised.value)
    # Everything the block wrote, before the check, is gone; the newer token stays.
    assert reload(db, invoice).status == "open"
    assert type(invoice).objects.using(db).count() == 1
    assert stored(db, "invoice:1") == 8


def test_fence_first_then_write(db: str) -> None:
    """The usual order: a stale writer never reaches its update."""
    from tasklock.django.fencing import fence

    invoice = new_invoice(db)
    model = type(invoice)

    def pay(token: int) -> None:
        with transaction.atomic(using=db):
            fence(f"invoice:{invoice.pk}", token, using=db)
            model.objects.using(db).filter(pk=invoice.pk).update(status="paid", paid_by=token)

    pay(3)
    with pytest.raises(StaleFence):
        pay(2)
    assert reload(db, invoice).paid_by == 3


def test_a_savepoint_keeps_the_outer_transaction(db: str) -> None:
    """StaleFence in a nested atomic() rolls back that savepoint; the caller may go on."""
    from tasklock.django.fencing import fence

    invoice = new_invoice(db)
    fence_in_transaction(db, "invoice:1", 4)
    with transaction.atomic(using=db):
        type(invoice).objects.using(db).filter(pk=invoice.pk).update(status="kept")
        with pytest.raises(StaleFence), transaction.atomic(using=db):
            fence("invoice:1", 3, using=db)
        fence("invoice:2", 3, using=db)
    assert reload(db, invoice).status == "kept"
    assert (stored(db, "invoice:1"), stored(db, "invoice:2")) == (4, 3)


def test_outside_a_transaction_is_refused(db: str) -> None:
    from tasklock.django.fencing import fence

    with pytest.raises(ConfigurationError, match=r"inside a transaction.*transaction\.atomic"):
        fence("invoice:1", 5, using=db)
    assert stored(db, "invoice:1") is None


def test_autocommit_off_counts_as_a_transaction(db: str) -> None:
    from tasklock.django.fencing import fence

    transaction.set_autocommit(False, using=db)
    try:
        fence("invoice:1", 5, using=db)
        transaction.rollback(using=db)
    finally:
        transaction.set_autocommit(True, using=db)
    assert stored(db, "invoice:1") is None


@pytest.mark.parametrize("database", ["postgresql", "mariadb"])
def test_concurrent_writers_wait_and_the_older_is_refused(
    request: pytest.FixtureRequest, database: str
) -> None:
    """The fence row stays locked until commit: an older writer waits for the newer one, then is
    refused (on SQLite writers are serialised by the database lock instead)."""
    from tasklock.django.fencing import fence

    alias: str = request.getfixturevalue(f"{database}_alias")
    fence_in_transaction(alias, "invoice:1", 1)
    fenced, release = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def newer() -> None:
        try:
            with transaction.atomic(using=alias):
                fence("invoice:1", 7, using=alias)
                fenced.set()
                release.wait(20)
        finally:
            connections[alias].close()

    def older() -> None:
        try:
            fence_in_transaction(alias, "invoice:1", 6)
            outcome["result"] = "accepted"
        except Exception as exc:
            outcome["result"] = exc
        finally:
            connections[alias].close()

    first = threading.Thread(target=newer)
    first.start()
    try:
        assert fenced.wait(20)
        second = threading.Thread(target=older)
        second.start()
        second.join(0.5)
        assert second.is_alive(), f"the older writer did not wait: {outcome}"
    finally:
        release.set()
        first.join(20)
    second.join(20)
    assert isinstance(outcome["result"], StaleFence), outcome
    assert outcome["result"].newer == 7
    assert stored(alias, "invoice:1") == 7


def test_mariadb_repeatable_read_snapshot_does_not_hide_a_newer_token(mariadb_alias: str) -> None:
    """A transaction that read before a newer token committed: MySQL's read-back must be a
    locking read, or the old snapshot would show the stale token as accepted."""
    from tasklock.django.fencing import fence
    from tasklock.django.models import Fence

    alias = mariadb_alias
    Fence.objects.using(alias).all().delete()
    fence_in_transaction(alias, "invoice:1", 5)

    def newer() -> None:
        try:
            fence_in_transaction(alias, "invoice:1", 6)
        finally:
            connections[alias].close()

    def read_then_fence() -> None:
        with transaction.atomic(using=alias):
            assert stored(alias, "invoice:1") == 5  # the snapshot starts here
            writer = threading.Thread(target=newer)
            writer.start()
            writer.join(20)
            assert stored(alias, "invoice:1") == 5  # still the snapshot
            fence("invoice:1", 5, using=alias)

    with pytest.raises(StaleFence) as raised:
        read_then_fence()
    assert raised.value.newer == 6


def test_mariadb_repeatable_read_snapshot_does_not_hide_a_newer_fence_column(
    mariadb_alias: str,
) -> None:
    """fenced_update's look for a newer fence is a locking read too: in a transaction that read
    the row before a newer fence committed, the older token is StaleFence, not "no row"."""
    from tasklock.django.fencing import fenced_update

    alias = mariadb_alias
    invoice = new_invoice(alias, status="new", fence=5)
    rows = type(invoice).objects.using(alias).filter(pk=invoice.pk)

    def newer() -> None:
        try:
            with transaction.atomic(using=alias):
                assert fenced_update(rows, 6, status="newer") == 1
        finally:
            connections[alias].close()

    def read_then_update() -> int:
        with transaction.atomic(using=alias):
            assert reload(alias, invoice).fence == 5  # the snapshot starts here
            writer = threading.Thread(target=newer)
            writer.start()
            writer.join(20)
            return fenced_update(rows, 5, status="stale")

    with pytest.raises(StaleFence) as raised:
        read_then_update()
    assert raised.value.newer == 6
    assert reload(alias, invoice).status == "newer"


# -- bad arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (None, "is None"),
        ("5", "must be an int"),
        (5.0, "must be an int"),
        (True, "must be an int"),
        (-1, "signed 64-bit"),
        (2**63, "signed 64-bit"),
    ],
)
def test_bad_tokens(sqlite_alias: str, token: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        fence_in_transaction(sqlite_alias, "invoice:1", token)
    assert stored(sqlite_alias, "invoice:1") is None


@pytest.mark.parametrize(
    ("resource", "message"),
    [("", "non-empty string"), (None, "non-empty string"), ("x" * 256, "256")],
)
def test_bad_resources(sqlite_alias: str, resource: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        fence_in_transaction(sqlite_alias, resource, 5)


def test_unknown_database_names_the_aliases(sqlite_alias: str) -> None:
    from tasklock.django.fencing import fence

    with pytest.raises(ConfigurationError, match=r"no database 'nope'.*'fence_sqlite'"):
        fence("invoice:1", 5, using="nope")


def test_unsupported_database_is_named(sqlite_alias: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections[sqlite_alias], "vendor", "oracle")
    with pytest.raises(ConfigurationError, match=r"'oracle'.*fenced_update"):
        fence_in_transaction(sqlite_alias, "invoice:1", 5)


def test_missing_table_says_to_migrate(tmp_path: Path) -> None:
    entry = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "bare.sqlite3")}
    with (
        django_database("fence_bare", entry, migrate=False) as alias,
        pytest.raises(ConfigurationError, match=r"'tasklock_fence' does not exist.*migrate"),
    ):
        fence_in_transaction(alias, "invoice:1", 5)


# -- fenced_update(): a fence column on the row ---------------------------------------------------


def test_fenced_update_paths(db: str) -> None:
    from tasklock.django.fencing import fenced_update

    invoice = new_invoice(db)
    rows = type(invoice).objects.using(db).filter(pk=invoice.pk)
    assert fenced_update(rows, 5, status="paid", paid_by=5) == 1  # fence NULL: accepted
    assert (reload(db, invoice).fence, reload(db, invoice).status) == (5, "paid")
    assert fenced_update(rows, 5, status="again") == 1  # equal: accepted
    assert fenced_update(rows, 8, status="refunded", paid_by=8) == 1  # newer
    with pytest.raises(StaleFence) as raised:
        fenced_update(rows, 6, status="stale", paid_by=6)
    assert raised.value.token == 6
    assert raised.value.newer == 8
    assert raised.value.resource == f"shop.invoice:{invoice.pk}"
    after = reload(db, invoice)
    assert (after.fence, after.status, after.paid_by) == (8, "refunded", 8)
    assert fenced_update(type(invoice).objects.using(db).filter(pk=-1), 9, status="x") == 0


def test_fenced_update_other_field_and_many_rows(db: str) -> None:
    from tasklock.django.fencing import fenced_update

    model = type(new_invoice(db, ship_fence=3))
    new_invoice(db, ship_fence=10)
    new_invoice(db)
    every = model.objects.using(db).all()
    # Each row is fenced by itself: the two that allow 5 change, the newer one is left.
    assert fenced_update(every, 5, field="ship_fence", status="shipped") == 2
    assert sorted(every.values_list("ship_fence", "status")) == [
        (5, "shipped"),
        (5, "shipped"),
        (10, "open"),
    ]
    assert list(every.values_list("fence", flat=True)) == [None, None, None]
    with pytest.raises(StaleFence) as raised:
        fenced_update(every.filter(ship_fence=10), 9, field="ship_fence", status="late")
    assert raised.value.newer == 10


def test_fenced_update_stale_rolls_back_its_transaction(db: str) -> None:
    from tasklock.django.fencing import fenced_update

    invoice = new_invoice(db, fence=4)
    rows = type(invoice).objects.using(db).filter(pk=invoice.pk)

    def write_then_update() -> None:
        with transaction.atomic(using=db):
            new_invoice(db, status="side effect")
            fenced_update(rows, 3, status="stale")

    with pytest.raises(StaleFence):
        write_then_update()
    assert type(invoice).objects.using(db).count() == 1
    assert reload(db, invoice).status == "open"


def test_fenced_update_bad_arguments(sqlite_alias: str) -> None:
    from tasklock.django.fencing import fenced_update
    from tests.django_project.shop.models import Invoice

    rows = Invoice.objects.using(sqlite_alias).all()
    rows.delete()
    with pytest.raises(ConfigurationError, match="is None"):
        fenced_update(rows, None, status="x")
    with pytest.raises(ConfigurationError, match=r"no field 'version'.*fence, ship_fence"):
        fenced_update(rows, 1, field="version", status="x")
    with pytest.raises(ConfigurationError, match=r"must be a BigIntegerField.*CharField"):
        fenced_update(rows, 1, field="status")
    with pytest.raises(ConfigurationError, match="do not pass fence="):
        fenced_update(rows, 1, fence=2)
    with pytest.raises(ConfigurationError, match="takes a QuerySet"):
        fenced_update([], 1, status="x")
    assert fenced_update(Invoice.objects.db_manager(sqlite_alias), 1, status="x") == 0


# -- the prune command ----------------------------------------------------------------------------


def prune(*args: str) -> str:
    out = io.StringIO()
    call_command(PRUNE, *args, stdout=out)
    return out.getvalue()


def test_prune_deletes_only_old_rows(db: str) -> None:
    from tasklock.django.models import Fence

    for resource in ("invoice:old", "invoice:older", "invoice:new"):
        fence_in_transaction(db, resource, 1)
    rows = Fence.objects.using(db)
    rows.filter(pk="invoice:old").update(updated_at=timezone.now() - timedelta(hours=2))
    rows.filter(pk="invoice:older").update(updated_at=timezone.now() - timedelta(days=3))
    assert "Deleted 1 fence row not" in prune("--older-than", "86400", "--database", db)
    assert "Deleted 1 fence row not" in prune("--older-than", "3600", "--database", db)
    assert sorted(rows.values_list("pk", flat=True)) == ["invoice:new"]
    assert f"Deleted 0 fence rows not written for 3600 seconds from database {db!r}" in prune(
        "--older-than", "3600", "--database", db
    )


def test_prune_refuses_short_ages_and_explains_why(sqlite_alias: str) -> None:
    with pytest.raises(CommandError, match=r"below the floor of 3600.*no holder of an older token"):
        prune("--older-than", "60", "--database", sqlite_alias)
    with override_settings(TASKLOCK={"TTL": 7200}):  # the TTL raises the floor
        with pytest.raises(CommandError, match="below the floor of 7200"):
            prune("--older-than", "3600", "--database", sqlite_alias)
        assert "Deleted 0" in prune("--older-than", "7200", "--database", sqlite_alias)
    with pytest.raises(CommandError, match="required: --older-than"):
        prune("--database", sqlite_alias)
    with pytest.raises(CommandError, match="number of seconds"):
        prune("--older-than", "soon", "--database", sqlite_alias)
    with pytest.raises(CommandError, match="no database 'nope'"):
        prune("--older-than", "3600", "--database", "nope")


# -- the migration --------------------------------------------------------------------------------


def test_migration_is_applied_and_complete(db: str) -> None:
    from django.db.migrations.recorder import MigrationRecorder

    connection = connections[db]
    applied = MigrationRecorder(connection).applied_migrations()
    assert ("tasklock", "0001_initial") in applied
    with connection.cursor() as cursor:
        tables = connection.introspection.table_names(cursor)
        assert "tasklock_fence" in tables
        columns = {
            column.name: column
            for column in connection.introspection.get_table_description(cursor, "tasklock_fence")
        }
    assert set(columns) == {"resource", "token", "updated_at"}
    assert connection.introspection.get_primary_key_columns(
        connection.cursor(), "tasklock_fence"
    ) == ["resource"]
    # The model matches its migration: nothing for makemigrations to write.
    call_command("makemigrations", "tasklock", check=True, dry_run=True, verbosity=0)


# -- a view, through Django's test client, against PostgreSQL ------------------------------------


def test_view_returns_409_for_a_stale_token(postgresql_alias: str) -> None:
    from tasklock.django.models import Fence
    from tests.django_project.shop.models import Invoice

    alias = postgresql_alias
    Fence.objects.using(alias).all().delete()
    invoice = Invoice.objects.using(alias).create()
    client = Client()
    with override_settings(ROOT_URLCONF="tests.django_project.shop.urls", SHOP_DATABASE=alias):
        url = f"/invoices/{invoice.pk}/pay"
        newer = client.post(url, {"token": "12", "status": "paid"})
        assert newer.status_code == 200, newer.content
        older = client.post(url, {"token": "11", "status": "paid late"})
        assert older.status_code == 409, older.content
        assert older.json()["newer"] == 12
        assert client.post("/invoices/999999/pay", {"token": "12"}).status_code == 404
    after = Invoice.objects.using(alias).get(pk=invoice.pk)
    assert (after.status, after.paid_by) == ("paid", 12)
    assert Fence.objects.using(alias).get(pk=f"invoice:{invoice.pk}").token == 12
