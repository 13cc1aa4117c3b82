"""The watchdog's per-hold batches (etcd keep-alives, ZooKeeper confirmations) without a store:
each call's answer or error in its place, one renewer per client and per-hold call, and the
verdict."""

from __future__ import annotations

import asyncio
from typing import Any

from tasklock.asyncio.batches import async_renewer
from tasklock.core.batches import HoldScript, judge_hold, sync_renewer
from tasklock.core.renewal import Outcome


class _Client:
    pass


def _renew(lock: Any, value: bytes) -> Any:
    if value == b"boom":
        raise ConnectionError("unreachable")
    return lock[value]


async def _arenew(lock: Any, value: bytes) -> Any:
    return _renew(lock, value)


def test_a_sync_batch_answers_each_hold_in_place_with_errors_as_values() -> None:
    renewer = sync_renewer(_Client(), _renew)
    pipe = renewer.pipeline(transaction=False)
    script = HoldScript("test", "-- test")
    holds = {b"a": 30, b"b": 0}
    for value in (b"a", b"boom", b"b"):
        script.queue(pipe, ["name"], [holds, value])
    first, error, gone = pipe.execute(raise_on_error=False)
    assert (first, gone) == (30, 0)
    assert isinstance(error, ConnectionError)


def test_an_async_batch_answers_each_hold_in_place_with_errors_as_values() -> None:
    pipe = async_renewer(_Client(), _arenew).pipeline(transaction=False)
    holds = {b"a": 1}
    pipe.execute_command("EVALSHA", "sha", 1, "name", holds, b"a")
    pipe.execute_command("EVALSHA", "sha", 1, "name", holds, b"boom")
    answers = asyncio.run(pipe.execute(raise_on_error=False))
    assert answers[0] == 1
    assert isinstance(answers[1], ConnectionError)


def test_one_renewer_per_client_and_per_hold_call() -> None:
    client = _Client()
    assert sync_renewer(client, _renew) is sync_renewer(client, _renew)
    assert async_renewer(client, _arenew) is not sync_renewer(client, _renew)  # type: ignore[comparison-overlap]
    assert sync_renewer(_Client(), _renew) is not sync_renewer(client, _renew)


def test_the_verdict() -> None:
    assert judge_hold([5], 0.0) is Outcome.RENEWED
    assert judge_hold([0], 0.0) is Outcome.LOST
    assert judge_hold([ConnectionError()], 0.0) is Outcome.UNREACHABLE
