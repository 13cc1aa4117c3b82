"""This process's id, without a system call per read.

Holds, tokens and clients compare the pid on every acquire and release to tell a forked child
from its parent (a child inherits neither holds nor sessions). ``os.getpid`` is a system call
each time (glibc no longer caches it), several per lock cycle; the id only changes in a fork,
which runs :func:`os.register_at_fork`'s hooks, so it is read once per process here.
"""

from __future__ import annotations

import os

__all__ = ["current_pid"]

_pid = os.getpid()


def current_pid() -> int:
    """This process's id (``os.getpid()``, kept since the last fork)."""
    return _pid


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)
