"""Hooks for metrics and tracing: each execution-lock attempt of the task layer and each hold, as
they happen, for :mod:`tasklock.prometheus` (histograms of wait and hold time) and
:mod:`tasklock.opentelemetry` (spans), or an observer of your own.

The guard asks :func:`acquiring` for a scope around its acquire. With no observer installed (the
default) that is one shared no-op object, so the task's hot path pays one call and no
allocation. An observer's exception is logged and dropped: metrics must never fail a task.

::

    class Printer:
        def acquiring(self, task, lock):
            return PrintScope(task, lock)        # has .done(outcome, waited, fence) and .hold()

    tasklock.observe.install(Printer())

Outcomes: ``"acquired"``, ``"duplicate_<policy>"`` (``skip``, ``raise``, ``retry``, and the
``on_wait_timeout`` policy after a ``"wait"`` timed out), ``"backend_error"`` (the store was
unreachable and the task fails) and ``"ran_unlocked"`` (unreachable, ``on_backend_error="run"``).
A hold follows ``"acquired"`` and ``"ran_unlocked"``: it spans the task's body.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

__all__ = [
    "AcquireScope",
    "HoldScope",
    "Observer",
    "acquiring",
    "install",
    "installed",
    "uninstall",
]

log = logging.getLogger("tasklock")


class HoldScope(Protocol):
    """A hold: from the body's start to its end (``error``: what the body raised, if anything)."""

    def done(self, error: BaseException | None) -> None: ...


class AcquireScope(Protocol):
    """One acquire attempt of the task layer."""

    def done(self, outcome: str, waited: float, fence: int | None) -> None:
        """The attempt's outcome; ``waited``: seconds spent waiting for the lock (0.0 when the
        call did not wait); ``fence``: the hold's token, if it got one."""

    def hold(self) -> HoldScope:
        """The body begins (after ``done``)."""


class Observer(Protocol):
    def acquiring(self, task: str, lock: str) -> AcquireScope:
        """An acquire of ``lock`` (its key) by task ``task`` begins."""


class _NoHold:
    __slots__ = ()

    def done(self, error: BaseException | None) -> None:
        pass


class _NoScope:
    __slots__ = ()

    def done(self, outcome: str, waited: float, fence: int | None) -> None:
        pass

    def hold(self) -> HoldScope:
        return _NO_HOLD


_NO_HOLD = _NoHold()
_NO_SCOPE = _NoScope()

_observers: tuple[Observer, ...] = ()
_lock = threading.Lock()


def install(observer: Observer) -> None:
    """Add ``observer`` (once: installing the same object again does nothing)."""
    global _observers
    with _lock:
        if observer not in _observers:
            _observers = (*_observers, observer)


def uninstall(observer: Observer) -> None:
    global _observers
    with _lock:
        _observers = tuple(o for o in _observers if o is not observer)


def installed() -> tuple[Observer, ...]:
    return _observers


def acquiring(task: str, lock: str) -> AcquireScope:
    """The scope of one acquire: a no-op with no observer installed."""
    observers = _observers
    if not observers:
        return _NO_SCOPE
    scopes = []
    for observer in observers:
        try:
            scopes.append(observer.acquiring(task, lock))
        except Exception:
            log.exception("tasklock observer %r failed at an acquire; ignored", observer)
    return _Fanout(scopes) if len(scopes) != 1 else _Guarded(scopes[0])


class _Guarded:
    """One observer's scope, its exceptions logged and dropped."""

    __slots__ = ("_scope",)

    def __init__(self, scope: AcquireScope) -> None:
        self._scope = scope

    def done(self, outcome: str, waited: float, fence: int | None) -> None:
        with _dropping("an acquire's end"):
            self._scope.done(outcome, waited, fence)

    def hold(self) -> HoldScope:
        with _dropping("a hold's start"):
            return _GuardedHold([self._scope.hold()])
        return _NO_HOLD


class _Fanout:
    __slots__ = ("_scopes",)

    def __init__(self, scopes: list[AcquireScope]) -> None:
        self._scopes = scopes

    def done(self, outcome: str, waited: float, fence: int | None) -> None:
        for scope in self._scopes:
            with _dropping("an acquire's end"):
                scope.done(outcome, waited, fence)

    def hold(self) -> HoldScope:
        holds: list[HoldScope] = []
        for scope in self._scopes:
            with _dropping("a hold's start"):
                holds.append(scope.hold())
        return _GuardedHold(holds)


class _GuardedHold:
    __slots__ = ("_holds",)

    def __init__(self, holds: list[HoldScope]) -> None:
        self._holds = holds

    def done(self, error: BaseException | None) -> None:
        # In reverse: a tracing observer's context is detached in the order it was attached.
        for hold in reversed(self._holds):
            with _dropping("a hold's end"):
                hold.done(error)


@contextmanager
def _dropping(what: str) -> Iterator[None]:
    try:
        yield
    except Exception:
        log.exception("tasklock observer failed at %s; ignored", what)
