"""The framework-free guard as a task would use it, for the server and topology tests."""

from __future__ import annotations

from typing import Any

import pytest

from tasklock.errors import DuplicateTask
from tasklock.guard import Guard

__all__ = ["check_singleton"]


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
