"""Extra Django database aliases for tests in a process whose Django is already configured.

Django is set up once per pytest process (``tests.django_project.setup``), with one in-memory
SQLite as ``default``; the fencing tests need a real PostgreSQL, a SQLite file and MariaDB beside
it. :func:`django_database` adds an alias to ``connections`` (the same dict as
``settings.DATABASES``), migrates it (``--run-syncdb`` creates the tables of the test app, which
has no migrations), and removes it again afterwards, closing its connection.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["django_database", "mariadb_database"]


@contextlib.contextmanager
def django_database(alias: str, entry: dict[str, Any], *, migrate: bool = True) -> Iterator[str]:
    """``entry`` as ``settings.DATABASES[alias]`` for the duration; migrated unless told not."""
    from django.core.management import call_command
    from django.db import DEFAULT_DB_ALIAS, connections

    if alias in connections.settings:
        raise RuntimeError(f"database alias {alias!r} is taken")
    configured = connections.configure_settings({DEFAULT_DB_ALIAS: {}, alias: dict(entry)})
    connections.settings[alias] = configured[alias]
    try:
        if migrate:
            call_command("migrate", database=alias, run_syncdb=True, verbosity=0)
        yield alias
    finally:
        with contextlib.suppress(AttributeError):
            connections[alias].close()
            del connections[alias]
        del connections.settings[alias]


@contextlib.contextmanager
def mariadb_database(host: str, port: int) -> Iterator[dict[str, Any]]:
    """A database of its own on the suite's MariaDB server (root, no password), as a Django
    ``DATABASES`` entry, dropped afterwards: the SQLAlchemy tests use ``test``, and both forms
    default to the same table name.

    Django's MySQL backend is for mysqlclient; where that is not installed, PyMySQL stands in
    (``pymysql.install_as_MySQLdb()``, which Django supports in practice).
    """
    import pymysql

    if importlib.util.find_spec("MySQLdb") is None:
        pymysql.install_as_MySQLdb()
    name = f"tasklock_django_{os.getpid()}"
    admin = pymysql.connect(host=host, port=port, user="root", password="", autocommit=True)
    try:
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        try:
            yield {
                "ENGINE": "django.db.backends.mysql",
                "NAME": name,
                "USER": "root",
                "PASSWORD": "",
                "HOST": host,
                "PORT": str(port),
                # MySQL's own default (Django's is READ COMMITTED): the stricter case for fence(),
                # whose read-back must not see an old snapshot.
                "OPTIONS": {"isolation_level": "repeatable read", "charset": "utf8mb4"},
            }
        finally:
            with admin.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        admin.close()
