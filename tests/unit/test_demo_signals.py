"""The demo's Ctrl-C handling: an interrupt swallowed inside a ``__del__`` is acted on, not
printed. (Celery's AsyncResult.__del__ is where a Ctrl-C often lands; Python then prints
"Exception ignored in ..." with a traceback, which made the demo's stderr more than its one line.)

Run in a child interpreter: pytest installs an unraisable hook of its own.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import gc
from tasklock.demo.signals import signals_interrupt

class RaisesWhenCollected:
    def __del__(self):
        raise {error}

with signals_interrupt():
    RaisesWhenCollected()
    gc.collect()
"""


def stderr_of_child(error: str) -> str:
    child = subprocess.run(
        [sys.executable, "-c", CHILD.format(error=error)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return child.stderr


def test_an_interrupt_swallowed_by_del_prints_nothing() -> None:
    assert stderr_of_child("KeyboardInterrupt") == ""


def test_other_errors_in_del_are_still_reported() -> None:
    assert "a real bug" in stderr_of_child("ValueError('a real bug')")
