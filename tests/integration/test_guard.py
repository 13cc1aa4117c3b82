"""The framework-free task policy against a real redis-server (adapters are tested separately)."""

from __future__ import annotations

import logging
import random
import threading
from typing import Any

import pytest
import redis

from tasklock import guard as guard_module
from tasklock import stats
from tasklock.errors import BackendUnavailable, ConfigurationError, DuplicateTask
from tasklock.guard import Duplicate, Guard
from tests.support.fences import server_micros
from tests.support.forking import ForkedChild
from tests.support.polling import eventually
from tests.support.servers import RedisServer, free_port

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = pytest.mark.usefixtures("resp")


def fence_in(result: str) -> int:
    """The fence token a ``settle`` result reports."""
    return int(result.rsplit(" ", 1)[1])


def settle(account_id: int, day: str = "today", fence_token: int | None = None) -> str:
    return f"settled {account_id} {day} {fence_token}"


def make_guard(server: RedisServer, **options: Any) -> Guard:
    return Guard(settle, "app.settle", {"url": server.url, **options})


def run(guard: Guard, args: tuple[Any, ...], body: Any = None, task_id: str = "t1") -> Any:
    return guard.run(
        args,
        {},
        body or (lambda extra: settle(*args, **extra)),
        task_id=task_id,
        on_skip=lambda d: ("skipped", d),
        on_retry=lambda d: ("retry", d),
        duplicate_error=DuplicateTask,
    )


def hold_in_thread(
    guard: Guard, args: tuple[Any, ...], task_id: str = "holder"
) -> tuple[threading.Event, threading.Event, threading.Thread]:
    """Run a body that holds the lock until told to finish."""
    entered, finish = threading.Event(), threading.Event()

    def body(extra: dict[str, Any]) -> str:
        entered.set()
        assert finish.wait(30)
        return "held"

    thread = threading.Thread(target=run, args=(guard, args, body, task_id))
    thread.start()
    assert entered.wait(10)
    return entered, finish, thread


def test_runs_under_the_lock_and_leaves_only_the_fence_counter(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = make_guard(redis_server, fencing=True)
    seen: list[bool] = []

    def body(extra: dict[str, Any]) -> str:
        seen.append(bool(r.exists(guard.lock_key((1,), {}))))
        return settle(1, **extra)

    before = server_micros(r)
    first = run(guard, (1,), body)
    assert first.startswith("settled 1 today ")
    assert fence_in(first) > before  # a new fence counter starts at the server's clock
    assert fence_in(run(guard, (1,))) > fence_in(first)
    assert seen == [True]
    assert r.keys("*") == [b"tasklock:{app.settle}:fence"]


def test_skip_reports_key_and_holder(
    r: redis.Redis, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    guard = make_guard(redis_server)
    before = stats.snapshot().get("duplicate_skip:app.settle", 0)
    _, finish, thread = hold_in_thread(guard, (1,), task_id="first")
    try:
        with caplog.at_level(logging.INFO, logger="tasklock"):
            outcome, duplicate = run(guard, (1,), task_id="second")
        assert outcome == "skipped"
        assert isinstance(duplicate, Duplicate)
        assert duplicate.key == guard.lock_key((1,), {})
        assert "task=first" in duplicate.holder
        assert 0 < (duplicate.holder_ttl or 0) <= 30
        assert duplicate.key in caplog.text
        assert "task=first" in caplog.text
        assert stats.snapshot()["duplicate_skip:app.settle"] == before + 1
        assert run(guard, (2,)) == "settled 2 today None"  # another key is independent
    finally:
        finish.set()
        thread.join()


def test_raise_policy(redis_server: RedisServer, r: redis.Redis) -> None:
    guard = make_guard(redis_server, on_duplicate="raise")
    _, finish, thread = hold_in_thread(guard, (1,))
    try:
        with pytest.raises(DuplicateTask, match="same key is running") as info:
            run(guard, (1,), task_id="other")
        assert info.value.key == guard.lock_key((1,), {})
    finally:
        finish.set()
        thread.join()


def test_retry_policy_backs_off_from_a_second_not_from_the_holders_ttl(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    """A live holder's TTL left (renewed by the watchdog) says nothing about when it finishes:
    the first retry comes within a second, later ones back off up to the TTL."""
    guard = make_guard(redis_server, on_duplicate="retry", ttl=10)
    _, finish, thread = hold_in_thread(guard, (1,))
    try:
        outcome, duplicate = run(guard, (1,), task_id="other")
        assert outcome == "retry"
        assert duplicate.holder_ttl is not None
        assert duplicate.holder_ttl > 9
        state = random.getstate()
        assert 0.5 <= guard.retry_delay(duplicate, attempt=0) <= 1.0
        assert 5.0 <= guard.retry_delay(duplicate, attempt=8) <= 10.0
        assert random.getstate() == state, "the jitter leaves the application's random stream"
    finally:
        finish.set()
        thread.join()


def test_forked_children_draw_their_own_jitter() -> None:
    child = ForkedChild(lambda report: report.update(drawn=guard_module._jitter.random()))
    assert child.collect()["drawn"] != guard_module._jitter.random()


def test_wait_policy_is_woken_by_the_release(redis_server: RedisServer, r: redis.Redis) -> None:
    guard = make_guard(redis_server, on_duplicate="wait", wait_timeout=60)
    _, finish, thread = hold_in_thread(guard, (1,))
    result: list[Any] = []
    waiter = threading.Thread(target=lambda: result.append(run(guard, (1,), task_id="w")))
    waiter.start()
    try:
        finish.set()
        thread.join()
        waiter.join(30)
        assert result == ["settled 1 today None"]
    finally:
        finish.set()


@pytest.mark.parametrize("fallback", ["skip", "raise", "retry"])
def test_wait_timeout_follows_the_fallback(
    redis_server: RedisServer, r: redis.Redis, fallback: str
) -> None:
    guard = make_guard(
        redis_server, on_duplicate="wait", wait_timeout=0.2, on_wait_timeout=fallback
    )
    _, finish, thread = hold_in_thread(guard, (1,))
    try:
        if fallback == "raise":
            with pytest.raises(DuplicateTask, match="after waiting"):
                run(guard, (1,), task_id="w")
        else:
            outcome, duplicate = run(guard, (1,), task_id="w")
            assert outcome == ("skipped" if fallback == "skip" else "retry")
            assert duplicate.waited
    finally:
        finish.set()
        thread.join()


def test_a_retry_of_the_same_task_waits_for_its_own_earlier_attempt(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    guard = make_guard(redis_server, on_duplicate="skip")
    _, finish, thread = hold_in_thread(guard, (1,), task_id="same-id")
    result: list[Any] = []
    retry = threading.Thread(target=lambda: result.append(run(guard, (1,), task_id="same-id")))
    retry.start()
    finish.set()
    thread.join()
    retry.join(30)
    assert result == ["settled 1 today None"]


def test_backend_down_fails_closed_by_default_and_runs_when_asked() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    closed = Guard(settle, "app.down", {"url": url})
    ran: list[int] = []
    with pytest.raises(BackendUnavailable, match=url.removesuffix("/0")):
        closed.run((1,), {}, lambda e: ran.append(1), task_id="x", on_skip=print, on_retry=print,
                   duplicate_error=DuplicateTask)  # fmt: skip
    assert ran == []
    open_ = Guard(settle, "app.down", {"url": url, "on_backend_error": "run", "fencing": True})
    result = open_.run((1,), {}, lambda e: e, task_id="x", on_skip=print, on_retry=print,
                       duplicate_error=DuplicateTask)  # fmt: skip
    assert result == {"fence_token": None}


def test_lost_lock_during_the_body_is_logged_not_raised(
    redis_server: RedisServer, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    guard = make_guard(redis_server)

    def body(extra: dict[str, Any]) -> str:
        r.delete(guard.lock_key((1,), {}))
        return "done"

    with caplog.at_level(logging.ERROR, logger="tasklock"):
        assert run(guard, (1,), body) == "done"
    assert "no longer held" in caplog.text


def test_lock_lost_while_the_body_runs_is_reported_with_the_reason(
    redis_server: RedisServer, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # A TTL with room for a loaded machine: the renewal that finds the key gone is due after a
    # third of it, and an answer judged after the TTL has run out reads "unreachable" instead.
    # At 0.6 s the test failed once while other test runs shared the 2 cores (not reproduced
    # since; that reading is the likely cause).
    guard = make_guard(redis_server, ttl=2.0)
    report = "was lost while the task ran"

    def body(extra: dict[str, Any]) -> str:
        r.delete(guard.lock_key((1,), {}))
        eventually(lambda: report in caplog.text, timeout=10, what="the watchdog's report")
        return "done"

    with caplog.at_level(logging.ERROR, logger="tasklock"):
        assert run(guard, (1,), body) == "done"
    [message] = [rec.getMessage() for rec in caplog.records if report in rec.getMessage()]
    assert f"{report} (the lock key was gone or held by another owner)" in message


def test_pending_markers_are_claimed_once_and_cleared_only_by_their_owner(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    guard = make_guard(redis_server, dedupe_enqueue=True, pending_ttl=60)
    assert guard.claim_pending((1,), {}, "A") is None
    assert guard.claim_pending((1,), {"day": "today"}, "B") == "A"
    assert guard.claim_pending((2,), {}, "C") is None
    assert 0 < r.pttl(guard.pending_key((1,), {})) <= 60_000
    guard.clear_pending((1,), {}, "B")  # not the owner: no effect
    assert guard.claim_pending((1,), {}, "D") == "A"
    guard.clear_pending((1,), {}, "A")
    assert guard.claim_pending((1,), {}, "D") is None


def test_decoration_time_errors() -> None:
    with pytest.raises(ConfigurationError, match="on_duplicate"):
        Guard(settle, "t", {"on_duplicate": "drop"})
    with pytest.raises(ConfigurationError, match="ttl"):
        Guard(settle, "t", {"ttl": 0})
    with pytest.raises(ConfigurationError, match="'acount'"):
        Guard(settle, "t", {"key": ["acount"]})
    with pytest.raises(ConfigurationError, match="token="):
        Guard(settle, "t", {"fencing": "token"})


def test_no_redis_configured_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TASKLOCK_URL", raising=False)
    guard = Guard(settle, "app.nowhere", {})
    with pytest.raises(ConfigurationError, match="no Redis configured.*TASKLOCK_URL"):
        guard.lock_key((1,), {}) and guard.lock_for("k")


def test_urls_use_redlock_and_duplicates_name_the_holder() -> None:
    from tests.support.servers import start_servers

    with start_servers(3) as servers:
        guard = Guard(settle, "app.redlocked", {"urls": [s.url for s in servers], "fencing": True})
        floor = max(server_micros(s.client()) for s in servers)
        _, finish, thread = hold_in_thread(guard, (1,), task_id="first")
        try:
            outcome, duplicate = run(guard, (1,), task_id="second")
            assert outcome == "skipped"
            assert "task=first" in duplicate.holder
            assert duplicate.holder_ttl is not None
            assert 0 < duplicate.holder_ttl <= 30
            key = guard.lock_key((1,), {})
            assert sum(bool(s.client().exists(key)) for s in servers) >= 2
        finally:
            finish.set()
            thread.join()
        assert fence_in(run(guard, (1,))) > floor
        # A master slower than the node deadline gets its release a little later (the late
        # replies' reaper): gone well before the 30 s TTL, not necessarily at once.
        key = guard.lock_key((1,), {})
        try:
            eventually(lambda: not any(s.client().exists(key) for s in servers), timeout=5,
                       what="released on every master")  # fmt: skip
        except AssertionError as exc:
            # Seen once under load (issue 33): say whose key stayed where, to find the path.
            left = [(s.port, s.client().get(key), s.client().pttl(key)) for s in servers]
            raise AssertionError(f"{exc}; (port, value, pttl) per master: {left}") from None
