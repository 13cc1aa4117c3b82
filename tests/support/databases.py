"""Real databases for the fencing tests: PostgreSQL from the ``pgserver`` wheel (PostgreSQL 16
binaries in the test extra, nothing to install by hand, about a second to start), SQLite files,
and MariaDB from the machine's ``mariadbd`` (Debian's ``mariadb-server``, which ``.ci/run``
installs), started by the suite in a temporary directory on a free loopback port, never the
machine's own server. Where MariaDB is not installed the tests that need it skip, naming the
install line; where it is installed and does not start, they fail.

PostgreSQL listens on a unix socket in its own temporary directory only (no TCP port), so test
runs cannot collide with each other or with a PostgreSQL on the machine.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

__all__ = ["MARIADB_INSTALL", "Postgres", "start_mariadb", "start_postgres"]

#: What a machine without MariaDB needs (the reason the MariaDB tests skip there).
MARIADB_INSTALL = "MariaDB is not installed: apt-get install mariadb-server (.ci/run does)"


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


@dataclass(frozen=True)
class MariaDB:
    """One running MariaDB of the suite's: root with no password on ``host:port``."""

    host: str
    port: int

    def url(self, database: str = "") -> str:
        """A SQLAlchemy URL (PyMySQL) of ``database`` on it."""
        return f"mysql+pymysql://root@{self.host}:{self.port}/{database}"


def _mariadb_binaries() -> tuple[str, str] | None:
    server = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin:/sbin")
    install = shutil.which("mariadb-install-db")
    return (server, install) if server and install else None


@contextlib.contextmanager
def start_mariadb() -> Iterator[MariaDB]:
    """A fresh MariaDB in a temporary directory on a free loopback port, stopped and removed
    afterwards; ``pytest.skip`` (naming the install line) only where it is not installed."""
    import pytest

    from tests.support.servers import free_port, wait_for

    binaries = _mariadb_binaries()
    if binaries is None:
        pytest.skip(MARIADB_INSTALL)
    server, install = binaries
    base = Path(tempfile.mkdtemp(prefix="tasklock-mariadb-"))
    data, log = base / "data", base / "error.log"
    try:
        subprocess.run(
            [install, "--no-defaults", f"--datadir={data}", "--skip-test-db", "--user=root",
             "--auth-root-authentication-method=normal"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        port = free_port()
        process = subprocess.Popen(
            [server, "--no-defaults", f"--datadir={data}", f"--port={port}",
             "--bind-address=127.0.0.1", f"--socket={base / 'mysqld.sock'}", "--user=root",
             f"--pid-file={base / 'mysqld.pid'}", f"--log-error={log}", "--skip-name-resolve"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(
                lambda: process.poll() is not None or _answers(port),
                f"MariaDB on 127.0.0.1:{port}",
            )
            if process.poll() is not None:
                raise RuntimeError(f"mariadbd exited: {log.read_text(errors='replace')[-2000:]}")
            yield MariaDB("127.0.0.1", port)
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _answers(port: int) -> bool:
    import pymysql

    try:
        pymysql.connect(host="127.0.0.1", port=port, user="root", password="").close()
    except pymysql.MySQLError:
        return False
    return True
