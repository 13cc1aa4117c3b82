"""How ``tasklock demo`` meets Ctrl-C, SIGTERM and SIGHUP: they interrupt the run, so that its
cleanup stops every process it started, and a second one during that cleanup is ignored.

Kept apart from the scenes because it is process-wide state (signal handlers, the unraisable
hook, one flag) that the run installs once and every waiting loop consults.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["check_interrupted", "interrupts_ignored", "signals_interrupt"]

#: Set by any interrupting signal. Python swallows an exception raised inside ``__del__`` (a
#: Ctrl-C that lands while Celery's AsyncResult is being collected, say), so the demo also checks
#: this flag at every step and every poll.
_interrupted = threading.Event()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    _interrupted.set()
    raise KeyboardInterrupt


def check_interrupted() -> None:
    """Raise KeyboardInterrupt if a signal came in, even one whose exception was swallowed."""
    if _interrupted.is_set():
        raise KeyboardInterrupt


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _stop_signals_handled_by(handler: Any) -> Iterator[None]:
    """Install ``handler`` for SIGINT, SIGTERM and SIGHUP for the block; restore them after."""
    previous: dict[signal.Signals, Any] = {}
    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        for signum in _STOP_SIGNALS:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _quiet_swallowed_interrupts(unraisable: Any) -> None:
    """``sys.unraisablehook`` while the demo runs: an interrupt raised inside a ``__del__`` is
    remembered in ``_interrupted`` and acted on, so Python's "Exception ignored in ..." traceback
    for it is noise on the user's terminal; anything else is reported as usual."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        return
    sys.__unraisablehook__(unraisable)


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP interrupt (and are remembered), so that cleanup runs."""
    _interrupted.clear()
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _quiet_swallowed_interrupts
    try:
        with _stop_signals_handled_by(_interrupt):
            yield
    finally:
        sys.unraisablehook = previous_hook


def interrupts_ignored() -> contextlib.AbstractContextManager[None]:
    """During cleanup: a second Ctrl-C must not leave processes behind."""
    return _stop_signals_handled_by(signal.SIG_IGN)
