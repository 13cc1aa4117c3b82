"""Helpers for the Celery tests: apps on the test's own redis-server, in-process workers, and
``celery worker`` subprocesses.

Never ``FLUSHALL`` a server a Celery app is using: kombu's Redis transport keeps its queue bindings
there (``_kombu.binding.*``) and a producer that already declared a queue does not declare it again,
so a flushed binding silently drops messages. :func:`clear_tasklock_keys` removes only tasklock's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

ROOT = Path(__file__).resolve().parents[3]
WORKER_READY_DEADLINE = 60.0

__all__ = [
    "Gates",
    "WorkerProcess",
    "clear_tasklock_keys",
    "configure",
    "host_time_zone",
    "in_process_worker",
    "parked_client",
]


def configure(app: Celery, url: str, **conf: Any) -> Celery:
    """Point ``app`` at the test server: broker, results and (by default) the locks."""
    app.conf.update(
        broker_url=url,
        result_backend=url,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        result_expires=600,
        **conf,
    )
    return app


def clear_tasklock_keys(client: redis.Redis, pattern: str = "tasklock:*") -> None:
    keys = list(client.scan_iter(match=pattern, count=1000))
    if keys:
        client.delete(*keys)


def parked_client(server: Any, parked: str) -> Iterator[redis.Redis]:
    """A fixture's client for a test that parks calls on ``parked``, a queue no worker consumes:
    tasklock's keys and the parked messages cleared before and after."""
    client = server.client()
    clear_tasklock_keys(client)
    client.delete(parked)
    yield client
    clear_tasklock_keys(client)
    client.delete(parked)
    client.close()


@contextlib.contextmanager
def host_time_zone(monkeypatch: Any, zone: str) -> Iterator[str]:
    """The process's local time zone for one test (what ``datetime.timestamp()`` of a naive
    datetime assumes), restored afterwards."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    assert time.timezone != 0 or zone == "UTC", "TZ did not take effect"
    try:
        yield zone
    finally:
        monkeypatch.undo()
        time.tzset()


@contextlib.contextmanager
def in_process_worker(app: Celery, **kwargs: Any) -> Iterator[Any]:
    """Celery's embedded test worker (a thread of this process), threads pool by default."""
    kwargs.setdefault("pool", "threads")
    kwargs.setdefault("concurrency", 4)
    kwargs.setdefault("perform_ping_check", False)
    kwargs.setdefault("loglevel", "WARNING")
    kwargs.setdefault("shutdown_timeout", 30)
    with start_worker(app, **kwargs) as worker:
        yield worker


class WorkerProcess:
    """``celery -A <module> worker`` as a subprocess in its own session (so that stopping it
    also stops its pool children), logging to a file the tests can read."""

    def __init__(
        self,
        module: str,
        env: dict[str, str],
        log_path: Path,
        *,
        pool: str = "prefork",
        concurrency: int = 3,
        queues: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.hostname = f"tl-{os.getpid()}-{time.monotonic_ns()}@localhost"
        self.log_path = log_path
        self.args = [
            sys.executable, "-m", "celery", "-A", module, "worker",
            f"--pool={pool}", f"--concurrency={concurrency}", "-n", self.hostname,
            "-l", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
            *(("-Q", queues) if queues else ()), *extra,
        ]  # fmt: skip
        # The checkout first; the caller's PYTHONPATH after it (another source tree under test,
        # packages installed to the side), as the benchmarks' workers do.
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        self.env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(ROOT), *inherited])}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, app: Celery) -> WorkerProcess:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.args, env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + WORKER_READY_DEADLINE
        while not app.control.ping([self.hostname], timeout=0.5):
            if self.process.poll() is not None:
                raise RuntimeError(f"celery worker exited at start:\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"celery worker not ready in time:\n{self.log()[-4000:]}")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self.process = None


class Gates:
    """Named events shared by the test and the task bodies running in the worker's threads."""

    def __init__(self) -> None:
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> threading.Event:
        with self._lock:
            return self._events.setdefault(name, threading.Event())
