"""The framework-free guard as a task would use it, for the server and topology tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from tasklock.errors import DuplicateTask
from tasklock.guard import Guard

__all__ = ["check_singleton", "hold_in_thread", "run_call"]


def settle(account_id: int, fence_token: int | None = None) -> int | None:
    return fence_token


def check_singleton(url: str, task_name: str) -> Guard:
    """A fenced singleton on ``url``: a duplicate started while it runs is skipped, and the next
    run's fence is higher than the first's. Returns the guard, for checks on the server."""
    guard = Guard(settle, task_name, {"url": url, "fencing": True})

    def run(body: Any) -> Any:
        return guard.run(
            (1,),
            {},
            body,
            task_id=None,
            on_skip=lambda d: "skipped",
            on_retry=lambda d: "retry",
            duplicate_error=DuplicateTask,
        )

    inside: list[Any] = []
    first = run(lambda extra: inside.append(run(lambda _: pytest.fail("ran twice"))) or extra)
    assert inside == ["skipped"]
    assert isinstance(first["fence_token"], int)
    assert run(lambda extra: extra["fence_token"]) > first["fence_token"]
    return guard


def run_call(guard: Guard, args: tuple[Any, ...], body: Any, task_id: str = "t1") -> Any:
    """One call through ``guard`` as an adapter makes it: a duplicate is ``"skipped"`` (or
    ``"retry"`` with on_duplicate="retry"), a ``"raise"`` raises DuplicateTask."""
    return guard.run(
        args,
        {},
        body,
        task_id=task_id,
        on_skip=lambda d: "skipped",
        on_retry=lambda d: "retry",
        duplicate_error=DuplicateTask,
    )


def hold_in_thread(guard: Guard, args: tuple[Any, ...]) -> Callable[[], None]:
    """Hold the lock of ``args`` in another thread (task id ``"holder"``) until the returned
    function is called; it returns once the body has begun."""
    entered, finish = threading.Event(), threading.Event()

    def body(extra: dict[str, Any]) -> str:
        entered.set()
        assert finish.wait(30), "the test never let the holder finish"
        return "held"

    thread = threading.Thread(target=run_call, args=(guard, args, body, "holder"))
    thread.start()
    assert entered.wait(10), "the holder's body never began"

    def done() -> None:
        finish.set()
        thread.join(10)

    return done
