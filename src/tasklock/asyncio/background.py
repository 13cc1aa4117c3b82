"""Background work that must run to its end although nobody awaits it (a release after a
cancelled acquire, the reply of a cancelled call, a connect for a fan-out round): asyncio keeps
only weak references to tasks, so each is kept here until it is done."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["keep", "spawn"]

_running: set[asyncio.Future[Any]] = set()

F = TypeVar("F", bound="asyncio.Future[Any]")


def keep(future: F) -> F:
    """Keep ``future`` referenced until it is done; returns it."""
    _running.add(future)
    future.add_done_callback(_running.discard)
    return future


def spawn(coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run ``coroutine`` as a task of the running loop, kept until done."""
    return keep(asyncio.get_running_loop().create_task(coroutine))
