"""What the examples' smoke tests share: a real redis-server per test, and worker subprocesses
that are always stopped, with their output shown when a test fails."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.support.servers import RedisServer, start_servers

#: The interpreter running the tests: workers and scripts use the same installation.
PYTHON = sys.executable


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server for one smoke test."""
    with start_servers(1) as servers:
        yield servers[0]


class Processes:
    """Subprocesses of one test, each in its own process group, its output in a log file."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(
        self, name: str, argv: Sequence[str], cwd: Path, env: Mapping[str, str]
    ) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*argv],
                cwd=cwd,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append((name, process, log))
        return process

    def run(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a script to completion (the producer side of an example)."""
        return subprocess.run(
            [*argv],
            cwd=cwd,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def check_alive(self) -> None:
        for name, process, log in self.started:
            if process.poll() is not None:
                pytest.fail(f"{name} exited with {process.returncode}:\n{log.read_text()[-3000:]}")

    def wait_until(self, predicate: Callable[[], Any], what: str, timeout: float = 30) -> Any:
        """Poll ``predicate`` (workers report through Redis: nothing to block on)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}\n{self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        return "\n".join(
            f"--- {name} ---\n{log.read_text(errors='replace')[-3000:]}"
            for name, _, log in self.started
        )

    def stop(self) -> None:
        for _, process, _ in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for _, process, _ in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # whatever is left of the group
            process.wait(5)


@pytest.fixture
def processes(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    yield procs
    procs.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(procs.output())  # shown by pytest under "Captured stdout teardown"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
