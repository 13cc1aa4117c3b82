"""Child processes the demo owns (redis-server, workers), and how they are always cleaned up.

Each child runs in its own session, so a Ctrl-C in the terminal reaches only the demo, which then
stops the children itself, in order. Stopping signals the child's whole process group (a Celery
worker's pool processes too): SIGTERM, then SIGKILL after a deadline. On Linux each child also
gets a parent-death signal, so even a SIGKILLed demo leaves nothing running.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

__all__ = ["DemoError", "Process", "stop_all"]

PR_SET_PDEATHSIG = 1


class DemoError(Exception):
    """A demo step failed; the message is the one line the user sees."""


def _parent_death_signal(sig: int) -> Callable[[], None] | None:
    """A preexec function asking Linux to send ``sig`` to the child when the demo dies."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig)

    return preexec


class Process:
    """A child process in its own process group, its output in ``log``."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.popen = popen
        self.log = log

    @classmethod
    def start(
        cls,
        name: str,
        argv: list[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        death_signal: int = signal.SIGKILL,
    ) -> Process:
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                preexec_fn=_parent_death_signal(death_signal),
            )
        return cls(name, popen, log)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def last_line(self) -> str:
        """The last non-empty line of the output, for one-line error messages."""
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        return lines[-1].strip() if lines else "(no output)"

    def check_alive(self) -> None:
        """DemoError naming the process and its last words if it has exited."""
        code = self.popen.poll()
        if code is not None:
            raise DemoError(f"{self.name} exited with status {code}: {self.last_line()}")

    def signal_group(self, sig: int) -> None:
        # The group outlives its leader when the leader dies first (pool processes): signal
        # the group even then. ProcessLookupError: nobody left in it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def stop(self, timeout: float) -> None:
        stop_all([self], timeout)


def stop_all(processes: Iterable[Process], timeout: float) -> None:
    """SIGTERM every group at once, wait up to ``timeout`` s in all, then SIGKILL what is left."""
    processes = list(processes)
    for process in processes:
        if process.alive():
            process.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.popen.wait(max(0.0, deadline - time.monotonic()))
    for process in processes:
        process.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.popen.wait(5)
