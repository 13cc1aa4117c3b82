"""Real databases for the fencing tests, one of each per test module: a PostgreSQL (pgserver,
started for the module and removed after it) and, where a MySQL/MariaDB answers on localhost:3306,
a database of its own on it (created for the module and dropped after it; the module's tests skip,
saying why, where none answers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.databases import Postgres, mysql_url_or_skip_reason, start_postgres


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """One PostgreSQL for the module."""
    with start_postgres() as server:
        yield server


@pytest.fixture(scope="module")
def mysql_url() -> Iterator[str]:
    """A SQLAlchemy URL of a fresh database on the local MySQL/MariaDB, dropped after the module
    (so parallel runs and other suites using ``test`` never see each other's tables)."""
    url, reason = mysql_url_or_skip_reason()
    if url is None:
        pytest.skip(reason)
    import sqlalchemy as sa

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
