"""Run a test body in a forked child and get its findings back: the child fills a report (a
JSON-able dict) and sends it through a pipe; an exception in the child is reported, not lost."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

__all__ = ["ForkedChild"]


class ForkedChild:
    """``body(report)`` in a child forked now; :meth:`collect` waits for it, returns the report."""

    def __init__(self, body: Callable[[dict[str, Any]], None]) -> None:
        read_end, write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child
            report: dict[str, Any] = {}
            try:
                body(report)
            except BaseException as exc:
                report["error"] = repr(exc)
            finally:
                os.write(write_end, json.dumps(report).encode())
                os._exit(0)
        os.close(write_end)
        self._read_end = read_end

    def running(self) -> bool:
        return os.waitpid(self.pid, os.WNOHANG) == (0, 0)

    def collect(self) -> dict[str, Any]:
        """The child's report, once it has exited; AssertionError if the body raised."""
        with os.fdopen(self._read_end, "rb") as pipe:
            report: dict[str, Any] = json.loads(pipe.read() or b"{}")
        os.waitpid(self.pid, 0)
        assert "error" not in report, report.get("error")
        return report
