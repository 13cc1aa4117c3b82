"""Mistakes in settings, met on every path a setting comes in, against real redis-servers.

What can be seen in the setting itself is refused where it is given (task decoration, Celery's
conf, the environment, the command line): a TTL under the lock core's millisecond floor, a
database path that is not a number. What only a server can tell is named for what it is when the
server says it, never as an outage: a wrong or missing password is an authentication failure
(the server answered), a database number the server does not have is out of range (no ACL hint),
and a TLS URL is named ``rediss://``. None of these may run a task unlocked under
``on_backend_error="run"``: they are settings to fix, not a Redis that is down. (Django's
``TASKLOCK`` and ``CELERY_TASKLOCK_URL`` are in ``test_django.py``.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from tasklock.celery import singleton_task
from tasklock.cli import main
from tasklock.config import resolve_options
from tasklock.errors import BackendUnavailable, ConfigurationError, DuplicateTask
from tasklock.guard import Guard, reset_all
from tasklock.rq import singleton_job
from tests.support.servers import RedisServer, free_port


def settle(account_id: int) -> str:
    return f"settled {account_id}"


def tiny_ttl_job(account_id: int) -> str:  # module level: singleton_job refuses nested functions
    return f"settled {account_id}"


def run_guarded(guard: Guard, ran: list[int] | None = None) -> Any:
    def body(extra: dict[str, Any]) -> str:
        if ran is not None:
            ran.append(1)
        return "ran"

    return guard.run(
        (1,),
        {},
        body,
        task_id="t1",
        on_skip=lambda d: "skipped",
        on_retry=lambda d: "retry",
        duplicate_error=DuplicateTask,
    )


def refused_without_running(url: str, name: str) -> str:
    """Run a task on ``url`` with ``on_backend_error="run"``; it must fail with a configuration
    error and not run unlocked. Returns the message."""
    ran: list[int] = []
    guard = Guard(settle, name, {"url": url, "on_backend_error": "run"})
    with pytest.raises(ConfigurationError) as info:
        run_guarded(guard, ran)
    assert ran == []  # not run unlocked
    assert not isinstance(info.value, BackendUnavailable)
    message = str(info.value)
    assert "did not answer" not in message
    return message


@pytest.fixture
def app() -> Iterator[Celery]:
    yield Celery("setting-errors", set_as_current=False)
    reset_all()


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TASKLOCK_URL", "TASKLOCK_URLS", "TASKLOCK_KEY_PREFIX"):
        monkeypatch.delenv(name, raising=False)


# -- a TTL under the core's floor: refused at decoration, not at every call -----------------------


@pytest.mark.parametrize("name", ["ttl", "pending_ttl"])
def test_a_ttl_under_a_millisecond_is_refused_where_the_task_is_defined(
    app: Celery, name: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"{name} must be at least 0.001 seconds"):
        Guard(settle, "app.tiny", {name: 0.0005})

    with pytest.raises(ConfigurationError, match=f"{name} must be at least 0.001 seconds"):

        @singleton_task(app=app, shared=False, **{name: 0.0005})
        def tiny(account_id: int) -> str:
            return "ran"

    with pytest.raises(ConfigurationError, match=f"{name} must be at least 0.001 seconds"):
        singleton_job(**{name: 0.0005})(tiny_ttl_job)


def test_a_celery_conf_ttl_under_a_millisecond_names_the_conf() -> None:
    with pytest.raises(ConfigurationError, match=r"^Celery app.conf: ttl must be at least 0.001"):
        resolve_options({}, {"tasklock_ttl": 0.0005})


def test_the_floor_itself_runs(r: redis.Redis, redis_server: RedisServer) -> None:
    # What decoration accepts, the lock core accepts: a task on the 1 ms floor runs, and its
    # enqueue marker (pending_ttl on the floor) is claimed.
    floor = {"url": redis_server.url, "ttl": 0.001, "pending_ttl": 0.001}
    guard = Guard(settle, "app.floor", floor)
    assert run_guarded(guard) == "ran"
    assert guard.claim_pending((1,), {}, "task-1") is None


# -- TLS URLs are named as TLS ------------------------------------------------------------------


def test_an_unreachable_tls_url_is_named_rediss() -> None:
    port = free_port()
    guard = Guard(settle, "app.tls", {"url": f"rediss://127.0.0.1:{port}/0"})
    with pytest.raises(BackendUnavailable) as info:
        run_guarded(guard)
    assert f"rediss://127.0.0.1:{port}/0" in str(info.value)


def test_a_tls_server_without_the_database_is_named_rediss_and_out_of_range(
    tls_redis_server: RedisServer,
) -> None:
    url = tls_redis_server.url.replace("/0?", "/99?")
    message = refused_without_running(url, "app.tls99")
    assert f"rediss://127.0.0.1:{tls_redis_server.port}/99" in message
    assert "no database 99" in message
    assert "out of range" in message
    assert "ACL" not in message


# -- passwords: the server answered; authentication failed ----------------------------------------


@pytest.fixture
def acl_user(r: redis.Redis) -> Iterator[str]:
    r.acl_setuser("worker", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all"])
    yield "worker"
    r.acl_deluser("worker")


def test_a_wrong_password_is_an_authentication_failure_and_never_runs_unlocked(
    redis_server: RedisServer, acl_user: str
) -> None:
    url = f"redis://{acl_user}:hunter2-typo@127.0.0.1:{redis_server.port}/0"
    message = refused_without_running(url, "app.badpw")
    assert "authentication failed" in message
    assert f"user '{acl_user}'" in message
    assert "hunter2" not in message  # the password is never shown


@pytest.fixture
def password_server(redis_server: RedisServer, r: redis.Redis) -> Iterator[RedisServer]:
    """The module's server with a password for the default user, for one test."""
    r.config_set("requirepass", "secret")
    try:
        yield redis_server
    finally:
        admin = redis_server.client(password="secret")
        admin.config_set("requirepass", "")
        admin.close()


def test_a_missing_password_says_the_server_requires_one(password_server: RedisServer) -> None:
    # A URL of its own: the process's client for the plain URL has connections that were made
    # before the password was set, and those stay authenticated.
    url = f"{password_server.url}?client_name=no-password"
    message = refused_without_running(url, "app.nopw")
    assert "requires a password" in message
    assert "gives none" in message
    wrong = url.replace("redis://", "redis://:typo@")
    assert "authentication failed" in refused_without_running(wrong, "app.badpw")


def test_a_celery_task_with_a_wrong_password_fails_and_its_body_never_runs(
    app: Celery, redis_server: RedisServer, acl_user: str
) -> None:
    ran: list[int] = []
    url = f"redis://{acl_user}:wrong@127.0.0.1:{redis_server.port}/0"

    @singleton_task(app=app, shared=False, url=url, on_backend_error="run")
    def charge(account_id: int) -> str:
        ran.append(account_id)
        return "ran"

    result = charge.apply((1,))
    assert result.failed()
    assert isinstance(result.result, ConfigurationError)
    assert "authentication failed" in str(result.result)
    assert ran == []


# -- database numbers ------------------------------------------------------------------------------


def test_a_database_the_server_does_not_have_is_out_of_range_not_an_acl_problem(
    app: Celery, redis_server: RedisServer
) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/99"
    message = refused_without_running(url, "app.db99")
    assert "no database 99" in message
    assert "out of range" in message
    assert "ACL" not in message

    @singleton_task(app=app, shared=False, url=url)
    def charge(account_id: int) -> str:
        return "ran"

    result = charge.apply((1,))
    assert result.failed()
    assert "no database 99" in str(result.result)


ABC = "redis://127.0.0.1:6379/abc"


def test_a_database_that_is_not_a_number_is_refused_on_every_path(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It used to mean database 0, silently: redis-py skips a path it cannot read as a number.
    refused = r"has database '/abc' in its path"
    with pytest.raises(ConfigurationError, match=r"options of task app\.abc: url=.*" + refused):
        Guard(settle, "app.abc", {"url": ABC})
    with pytest.raises(ConfigurationError, match=refused):

        @singleton_task(app=app, shared=False, url=ABC)
        def charge(account_id: int) -> str:
            return "ran"

    with pytest.raises(ConfigurationError, match=r"^Celery app\.conf: url=.*" + refused):
        resolve_options({}, {"tasklock_url": ABC})
    monkeypatch.setenv("TASKLOCK_URLS", f"redis://a:1/0,{ABC},redis://c:1/0")
    with pytest.raises(ConfigurationError, match=r"^environment: urls\[1\]=.*" + refused):
        resolve_options({})
    monkeypatch.delenv("TASKLOCK_URLS")
    monkeypatch.setenv("TASKLOCK_URL", ABC)
    with pytest.raises(ConfigurationError, match=r"^environment: url=.*" + refused):
        resolve_options({})


def test_a_broker_url_with_a_database_that_is_not_a_number_is_refused(app: Celery) -> None:
    app.conf.broker_url = ABC  # no tasklock URL anywhere: the broker's Redis would hold the locks

    @singleton_task(app=app, shared=False)
    def charge(account_id: int) -> str:
        return "ran"

    with pytest.raises(ConfigurationError, match="has database '/abc'"):
        charge(1)


def test_the_command_refuses_a_database_that_is_not_a_number(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["ls", "--url", ABC]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "has database '/abc'" in err
    assert "Traceback" not in err
