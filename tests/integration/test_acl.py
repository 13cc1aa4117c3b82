"""Redis ACL users (issue 10, defect 4): decided per permission, checked by the doctor.

* no PUBLISH: a release still succeeds (it used to raise after deleting the key, failing a task
  whose body had run); waiters fall back to polling, with one warning;
* no SUBSCRIBE: waiters poll, with one warning;
* no EVALSHA: a clear ConfigurationError naming the command, at the first lock call;
* ``tasklock doctor`` takes a probe lock as the configured user and says which of these it lacks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
import redis

import tasklock
from tasklock.core import wakeup
from tasklock.core.scripts import ACL_RULES
from tasklock.guard import Guard
from tasklock.ops.doctor import run_doctor
from tests.support.polling import eventually
from tests.support.servers import RedisServer, start_servers
from tests.support.waking import evalsha_calls

PASSWORD = "secret"


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """One server with users that each lack one thing, and one with exactly what is needed."""
    with start_servers(1) as servers:
        admin = servers[0].client()
        everything = ["on", f">{PASSWORD}", "~*", "allchannels", "+@all"]
        admin.execute_command("ACL", "SETUSER", "nopublish", *everything, "-publish")
        admin.execute_command("ACL", "SETUSER", "nosubscribe", *everything, "-subscribe")
        admin.execute_command("ACL", "SETUSER", "noevalsha", *everything, "-evalsha")
        # The queue's and the permits' commands, which only a waiter or a semaphore runs:
        admin.execute_command("ACL", "SETUSER", "norpush", *everything, "-rpush")
        admin.execute_command("ACL", "SETUSER", "nozadd", *everything, "-zadd")
        # A rate limit's hash:
        admin.execute_command("ACL", "SETUSER", "nohset", *everything, "-hset")
        minimal = ACL_RULES.replace("<your lock names>", "orders:*").split()
        admin.execute_command("ACL", "SETUSER", "minimal", "on", f">{PASSWORD}", *minimal)
        admin.close()
        yield servers[0]


@pytest.fixture(autouse=True)
def fresh_warnings() -> Iterator[None]:
    """The once-per-server warnings are per process: a server of an earlier module on the same
    port would have used this one's up."""
    wakeup._warned.clear()
    yield
    wakeup._warned.clear()


def as_user(server: RedisServer, user: str) -> redis.Redis:
    return server.client(username=user, password=PASSWORD)


def url_of(server: RedisServer, user: str) -> str:
    return f"redis://{user}:{PASSWORD}@127.0.0.1:{server.port}/0"


def wait_behind_holder(server: RedisServer, user: str, name: str) -> bool:
    """A holder in this thread, a blocked waiter in another (both as ``user``); True once the
    waiter got the lock after the holder's release."""
    client = as_user(server, user)
    admin = server.client()  # counts commands: the users under test may lack INFO
    holder = tasklock.Lock(client, name, timeout=10)
    assert holder.acquire()
    got: list[bool] = []
    tries_before = evalsha_calls(admin)

    def waiter() -> None:
        got.append(tasklock.Lock(client, name, timeout=10).acquire(blocking_timeout=20))

    thread = threading.Thread(target=waiter)
    thread.start()
    # Released only once the waiter has tried twice (before and after its SUBSCRIBE): released
    # earlier, it could take the lock at its first try and never wait at all.
    eventually(lambda: evalsha_calls(admin) >= tries_before + 2, what="the waiter is waiting")
    holder.release()
    thread.join(30)
    client.close()
    admin.close()
    return got == [True]


def test_without_publish_a_release_succeeds_and_waiters_poll(
    acl_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = as_user(acl_server, "nopublish")
    caplog.set_level(logging.WARNING, logger="tasklock.wakeup")
    for _ in range(3):
        lock = tasklock.Lock(client, "orders:nopub", timeout=10)
        assert lock.acquire()
        lock.release()  # used to raise ResponseError after the key was already deleted
        assert not client.exists("orders:nopub")
    assert wait_behind_holder(acl_server, "nopublish", "orders:nopub-wait")
    refused = [r for r in caplog.records if "refused PUBLISH" in r.getMessage()]
    assert len(refused) == 1  # once per server, not once per release
    assert "+publish" in refused[0].getMessage()


def test_without_publish_a_task_body_that_ran_returns_its_result(acl_server: RedisServer) -> None:
    ran: list[int] = []

    def settle(account: int) -> str:
        ran.append(account)
        return f"settled {account}"

    guard = Guard(settle, "acl.settle", {"url": url_of(acl_server, "nopublish")})
    result = guard.run(
        (7,),
        {},
        lambda extra: settle(7, **extra),
        task_id="t1",
        on_skip=lambda d: "skipped",
        on_retry=lambda d: "retry",
        duplicate_error=tasklock.DuplicateTask,
    )
    assert ran == [7]
    assert result == "settled 7"  # the release no longer fails the task after its body ran


def test_without_subscribe_waiters_poll_with_one_warning(
    acl_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tasklock.wakeup")

    def refused() -> int:
        return sum("refused SUBSCRIBE" in r.getMessage() for r in caplog.records)

    assert wait_behind_holder(acl_server, "nosubscribe", "orders:nosub")
    eventually(refused, what="the refused SUBSCRIBE was logged")
    assert wait_behind_holder(acl_server, "nosubscribe", "orders:nosub-again")
    assert refused() == 1  # once per server, not once per waiter


def test_without_evalsha_the_error_names_the_command(acl_server: RedisServer) -> None:
    lock = tasklock.Lock(as_user(acl_server, "noevalsha"), "orders:noeval", timeout=10)
    with pytest.raises(tasklock.ConfigurationError) as info:
        lock.acquire()
    assert "evalsha" in str(info.value).lower()
    assert f"127.0.0.1:{acl_server.port}" in str(info.value)


def test_the_documented_minimal_acl_is_enough(acl_server: RedisServer) -> None:
    client = as_user(acl_server, "minimal")
    with tasklock.Lock(client, "orders:1", timeout=1, watchdog=True) as lock:
        assert lock.extend(1)
        assert lock.locked()
    with tasklock.Semaphore(client, "orders:permits", 2, timeout=1, watchdog=True) as sem:
        assert sem.extend(1)
        assert sem.owned()
        assert len(sem.holders()) == 1
    limit = tasklock.RateLimit(client, "orders:rate", "1/h")
    assert limit.try_acquire()
    assert not limit.try_acquire()
    assert wait_behind_holder(acl_server, "minimal", "orders:2")


@pytest.mark.parametrize(
    ("user", "status", "fragment"),
    [
        ("minimal", "ok", "can run the lock scripts"),
        ("nopublish", "warn", "PUBLISH"),
        ("nosubscribe", "warn", "subscribe"),
        ("noevalsha", "fail", "evalsha"),
        ("norpush", "fail", "lock scripts"),  # (Redis < 7.2 does not name the command)
        ("nozadd", "fail", "lock scripts"),
        ("nohset", "fail", "lock scripts"),
    ],
)
def test_doctor_checks_the_users_permissions(
    acl_server: RedisServer, user: str, status: str, fragment: str
) -> None:
    report = run_doctor([url_of(acl_server, user)])
    [check] = [c for c in report.checks if c.name == "permissions"]
    assert check.status.value == status, check
    assert fragment in check.message
    if status != "ok":
        assert "ACL SETUSER" in check.fix
    assert report.exit_code() == (1 if status == "fail" else 0)
