"""Real databases for the fencing tests: PostgreSQL from the ``pgserver`` wheel (PostgreSQL 16
binaries in the test extra, nothing to install by hand, about a second to start), SQLite files,
and a MySQL/MariaDB server where one answers on localhost:3306 (tests skip with the reason where
none does).

PostgreSQL listens on a unix socket in its own temporary directory only (no TCP port), so test
runs cannot collide with each other or with a PostgreSQL on the machine.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

__all__ = ["Postgres", "mysql_url_or_skip_reason", "start_postgres"]


@dataclass(frozen=True)
class Postgres:
    """One running PostgreSQL: its socket directory and database."""

    socket_dir: str
    database: str = "postgres"
    user: str = "postgres"

    @property
    def sqlalchemy_url(self) -> str:
        """For ``sqlalchemy.create_engine`` (psycopg 3; also ``create_async_engine``)."""
        return f"postgresql+psycopg://{self.user}@/{self.database}?host={quote(self.socket_dir)}"

    @property
    def dsn(self) -> str:
        """For ``psycopg.connect``."""
        return f"host={self.socket_dir} dbname={self.database} user={self.user}"

    def django_database(self) -> dict[str, object]:
        """A Django ``DATABASES`` entry."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": self.database,
            "USER": self.user,
            "HOST": self.socket_dir,
        }


@contextlib.contextmanager
def start_postgres() -> Iterator[Postgres]:
    """A fresh PostgreSQL in a temporary directory, stopped and removed afterwards."""
    import pgserver

    data = tempfile.mkdtemp(prefix="tasklock-pg-")
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers); nothing to act on.
        warnings.simplefilter("ignore")
        server = pgserver.get_server(data, cleanup_mode="stop")
    try:
        uri = server.get_uri()
        socket_dir = uri.split("host=", 1)[1].split("&", 1)[0]
        yield Postgres(socket_dir)
    finally:
        with contextlib.suppress(Exception):
            server.cleanup()
        shutil.rmtree(data, ignore_errors=True)


def mysql_url_or_skip_reason(host: str = "127.0.0.1", port: int = 3306) -> tuple[str | None, str]:
    """A SQLAlchemy URL of a MySQL/MariaDB answering on ``host:port`` as root with no password
    (database ``test``), or None and why not."""
    try:
        import pymysql
    except ImportError:
        return None, "pymysql is not installed"
    with socket.socket() as probe:
        probe.settimeout(0.5)
        if probe.connect_ex((host, port)) != 0:
            return None, f"no MySQL/MariaDB server answers on {host}:{port}"
    try:
        pymysql.connect(host=host, port=port, user="root", password="", database="test").close()
    except Exception as exc:
        return None, f"the MySQL/MariaDB server on {host}:{port} refused root@test: {exc}"
    return f"mysql+pymysql://root@{host}:{port}/test", ""
