"""Real databases for the fencing tests, one of each per test module: a PostgreSQL (pgserver,
started for the module and removed after it) and a database of its own on the suite's MariaDB
(created for the module and dropped after it; skipped, naming the install line, only where
MariaDB is not installed)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.databases import MariaDB, Postgres, start_postgres


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """One PostgreSQL for the module."""
    with start_postgres() as server:
        yield server


@pytest.fixture(scope="module")
def mysql_url(mariadb: MariaDB) -> Iterator[str]:
    """A SQLAlchemy URL of a fresh database on the suite's MariaDB, dropped after the module."""
    import sqlalchemy as sa

    url = mariadb.url()
    name = f"tasklock_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(url)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        try:
            yield url.rsplit("/", 1)[0] + f"/{name}"
        finally:
            with admin.begin() as conn:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
    finally:
        admin.dispose()
