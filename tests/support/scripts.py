"""A Python script run as a process of its own, talked to line by line: what the tests that pause,
kill or resume one holder among several (Leader, lost-by-clock) start it with."""

from __future__ import annotations

import signal
import subprocess
import sys

__all__ = ["ScriptProcess"]


class ScriptProcess:
    """``python -c code *args``, its stdout read a line at a time; stdin stays open (a script
    that ends with ``sys.stdin.read()`` lives until it is stopped)."""

    def __init__(self, code: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def line(self) -> str:
        """The next line it printed; an AssertionError when it exited first."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the process exited (code {self.process.wait(10)}) before saying more"
        return line.strip()

    def stop(self) -> None:
        """Kill it, also when it is stopped (SIGSTOP)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(10)
