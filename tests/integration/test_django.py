"""Django's TASKLOCK setting: system checks, first-use validation, override_settings, precedence.

Django is configured once for the pytest process from ``tests/django_project`` (without
``TASKLOCK``, so the rest of the suite still sees none); each test sets ``TASKLOCK`` with
``override_settings``. At the end, a Celery task and a django-rq job of that project, with no
tasklock options of their own, run through real in-process workers against the module's
redis-server and follow ``TASKLOCK`` alone.
"""

from __future__ import annotations

import importlib
import io
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from tasklock import backends, config, fleet
from tasklock.errors import ConfigurationError, DuplicateTask
from tasklock.guard import Guard
from tasklock.settings_sources import django_setting
from tests.django_project.settings import redis_settings
from tests.support.polling import eventually
from tests.support.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def django_project() -> None:
    from tests.django_project import setup

    setup()


@pytest.fixture(autouse=True)
def no_tasklock_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TASKLOCK_URL", "TASKLOCK_URLS", "TASKLOCK_KEY_PREFIX"):
        monkeypatch.delenv(name, raising=False)


def settings_tasklock() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.TASKLOCK)


def tasklock_ids() -> list[str]:
    return sorted(message.id or "" for message in run_checks(tags=["tasklock"]))


def settle(account_id: int, fence_token: int | None = None) -> str:
    return f"settled {account_id}"


def run_guarded(guard: Guard, args: tuple[Any, ...], body: Any) -> Any:
    return guard.run(
        args,
        {},
        body,
        task_id="t1",
        on_skip=lambda d: ("skipped", d),
        on_retry=lambda d: ("retry", d),
        duplicate_error=DuplicateTask,
    )


# -- no TASKLOCK, no Django ----------------------------------------------------------------------


def test_import_tasklock_imports_no_django_and_unconfigured_django_reads_nothing() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TASKLOCK_"))}
    code = (
        "import sys, tasklock, tasklock.config, tasklock.guard, tasklock.settings_sources\n"
        "loaded = sorted(m for m in sys.modules if 'django' in m)\n"
        "assert not loaded, loaded\n"
        "import django.conf\n"
        "assert not django.conf.settings.configured\n"
        "print(tasklock.settings_sources.django_setting())\n"
        "print(sorted(set(tasklock.config.resolve_options({}).sources.values())))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["{}", "['defaults']"]


def test_absent_setting_reads_empty_and_checks_pass() -> None:
    from django.conf import settings

    from tasklock.django.settings import read_tasklock_setting

    assert not hasattr(settings, "TASKLOCK")
    assert read_tasklock_setting() == {}
    assert django_setting() == {}
    assert tasklock_ids() == []
    assert "Django TASKLOCK" not in config.resolve_options({}).sources.values()


def test_every_key_maps_to_its_option() -> None:
    from tasklock.django.settings import read_tasklock_setting

    setting = {
        "URL": "redis://cache.internal:6379/2",
        "TTL": 12,
        "KEY_PREFIX": "shop",
        "ON_DUPLICATE": "wait",
        "ON_BACKEND_ERROR": "raise",
        "WAIT_TIMEOUT": 5,
        "ON_WAIT_TIMEOUT": "skip",
        "DEDUPE_ENQUEUE": True,
        "PENDING_TTL": 600,
        "WATCHDOG": True,
    }
    with override_settings(TASKLOCK=setting):
        assert tasklock_ids() == []
        assert read_tasklock_setting() == {key.lower(): value for key, value in setting.items()}
        options = config.resolve_options({})
    assert (options.url, options.ttl, options.key_prefix) == (
        "redis://cache.internal:6379/2",
        12,
        "shop",
    )
    assert (options.on_duplicate, options.wait_timeout, options.on_wait_timeout) == (
        "wait",
        5,
        "skip",
    )
    assert (options.dedupe_enqueue, options.pending_ttl) == (True, 600)
    assert {options.sources[key.lower()] for key in setting} == {"Django TASKLOCK"}


# -- system checks -------------------------------------------------------------------------------

REDLOCK = ["redis://n1:6379/0", "redis://n2:6379/0", "redis://n3:6379/0"]
#: A database path that is not a number: redis-py would silently use database 0.
NOT_A_DATABASE = "redis://cache.internal:6379/abc"


@pytest.mark.parametrize(
    ("setting", "expected", "named"),
    [
        ({"TTLL": 30}, ["tasklock.E001"], "TTLL"),
        ({"ttl": 30}, ["tasklock.E001"], "ttl"),
        ({"URL": "redis://a:6379/0", 7: 1}, ["tasklock.E001"], "7"),
        ({"TTL": "30"}, ["tasklock.E002"], "TTL"),
        ({"TTL": 0}, ["tasklock.E002"], "TTL"),
        ({"TTL": -5}, ["tasklock.E002"], "TTL"),
        ({"PENDING_TTL": 0}, ["tasklock.E002"], "PENDING_TTL"),
        ({"TTL": 0.0005}, ["tasklock.E002"], "TTL"),  # under the core's 1 ms: every call fails
        ({"PENDING_TTL": 0.0005}, ["tasklock.E002"], "PENDING_TTL"),
        ({"WAIT_TIMEOUT": -1}, ["tasklock.E002"], "WAIT_TIMEOUT"),
        ({"ON_DUPLICATE": "ignore"}, ["tasklock.E003"], "ON_DUPLICATE"),
        ({"ON_WAIT_TIMEOUT": "wait"}, ["tasklock.E003"], "ON_WAIT_TIMEOUT"),
        ({"ON_BACKEND_ERROR": "ignore"}, ["tasklock.E003"], "ON_BACKEND_ERROR"),
        ({"WATCHDOG": "yes"}, ["tasklock.E004"], "WATCHDOG"),
        ({"DEDUPE_ENQUEUE": 1}, ["tasklock.E004"], "DEDUPE_ENQUEUE"),
        ({"KEY_PREFIX": ""}, ["tasklock.E004"], "KEY_PREFIX"),
        ({"URL": "localhost:6379"}, ["tasklock.E006"], "URL"),
        ({"URL": 6379}, ["tasklock.E006"], "URL"),
        ({"URLS": "redis://n1:6379/0"}, ["tasklock.E006"], "URLS"),
        ({"URLS": [REDLOCK[0], REDLOCK[0], REDLOCK[1]]}, ["tasklock.E006"], "URLS"),
        ({"URLS": REDLOCK[:2]}, ["tasklock.E006"], "URLS"),
        ({"URL": NOT_A_DATABASE}, ["tasklock.E006"], "/abc"),
        ({"URLS": [REDLOCK[0], NOT_A_DATABASE, REDLOCK[2]]}, ["tasklock.E006"], "/abc"),
        ({"URL": REDLOCK[0], "URLS": REDLOCK}, ["tasklock.E007"], "URL"),
        ({"KEY": ["account_id"]}, ["tasklock.E008"], "KEY"),
        ({"FENCING": True}, ["tasklock.E008"], "FENCING"),
        (["URL", "redis://a:6379/0"], ["tasklock.E009"], "TASKLOCK"),
        ("redis://a:6379/0", ["tasklock.E009"], "TASKLOCK"),
        ({"TTL": 0.5}, ["tasklock.W001"], "TTL"),
        ({"TTL": 0.001}, ["tasklock.W001"], "TTL"),  # the floor itself works, and is risky
        ({"ON_BACKEND_ERROR": "run"}, ["tasklock.W002"], "ON_BACKEND_ERROR"),
        ({"WATCHDOG": False}, ["tasklock.W003"], "WATCHDOG"),
    ],
)
def test_each_wrong_setting_has_its_own_id_and_hint(
    setting: Any, expected: list[str], named: str
) -> None:
    from tasklock.django.checks import CHECK_IDS
    from tasklock.django.settings import read_tasklock_setting

    with override_settings(TASKLOCK=setting):
        messages = run_checks(tags=["tasklock"])
        assert sorted(message.id or "" for message in messages) == expected
        for message in messages:
            assert message.id in CHECK_IDS
            assert message.hint, message
            assert named in message.msg, message.msg
            assert message.is_serious() == (".E" in (message.id or ""))
        errors = [message for message in messages if message.is_serious()]
        if errors:
            with pytest.raises(ImproperlyConfigured, match=re.escape(f"[{expected[0]}]")):
                read_tasklock_setting()
        else:
            read_tasklock_setting()


def test_messages_name_the_key_as_written() -> None:
    with override_settings(TASKLOCK={"ttl": 30, "TTLL": 30, "TTL": 0, "KEY": ["a"]}):
        messages = {m.msg: m.hint for m in run_checks(tags=["tasklock"])}
    assert set(messages) == {
        "TASKLOCK['ttl']: keys are upper case, 'ttl' should be 'TTL'",
        "TASKLOCK['TTLL']: unknown key 'TTLL'",
        "TASKLOCK['TTL']: TTL must be a number of seconds > 0, got 0",
        "TASKLOCK['KEY']: KEY describes one task's arguments and cannot be a project-wide setting",
    }
    assert messages["TASKLOCK['ttl']: keys are upper case, 'ttl' should be 'TTL'"] == (
        "rename 'ttl' to 'TTL'"
    )
    assert messages["TASKLOCK['TTLL']: unknown key 'TTLL'"].startswith("did you mean 'TTL'?")


def test_several_wrong_settings_give_one_message_each() -> None:
    setting = {"TTL": 0, "ON_DUPLICATE": "ignore", "URL": "localhost", "WATCHDOG": False}
    with override_settings(TASKLOCK=setting):
        assert tasklock_ids() == [
            "tasklock.E002",
            "tasklock.E003",
            "tasklock.E006",
            "tasklock.W003",
        ]


def test_every_code_tasklock_config_can_report_is_documented() -> None:
    from tasklock.django.checks import CHECK_IDS

    # The options' problems live in tasklock.config, and those of each backend in its hooks
    # module (tasklock.etcd.backend, ...), which the registry in tasklock.backends names, and in
    # the helpers those modules share (tasklock.core.backend_hooks).
    hooks = {entry.hooks for entry in backends.REGISTRY.values() if entry.hooks}
    hooks.add("tasklock.core.backend_hooks")
    source = Path(config.__file__).read_text() + Path(backends.__file__).read_text()
    for module in sorted(hooks):
        source += Path(str(importlib.import_module(module).__file__)).read_text()
    codes = set(re.findall(r'"([EW]\d{3})"', source))
    assert codes, "tasklock.config no longer names its problem codes as string literals"
    assert {f"tasklock.{code}" for code in codes} | {"tasklock.E009"} == set(CHECK_IDS)


def test_manage_py_check_reports_errors_and_fails() -> None:
    with override_settings(TASKLOCK={"TTL": 0}), pytest.raises(SystemCheckError) as failure:
        call_command("check")
    assert "tasklock.E002" in str(failure.value)
    assert "TASKLOCK['TTL']" in str(failure.value)


def test_manage_py_check_passes_with_warnings_that_can_be_silenced() -> None:
    setting = {"URL": "redis://a:6379/0", "ON_BACKEND_ERROR": "run"}
    out, err = io.StringIO(), io.StringIO()
    with override_settings(TASKLOCK=setting):
        call_command("check", stdout=out, stderr=err)
    assert "tasklock.W002" in out.getvalue() + err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    with override_settings(TASKLOCK=setting, SILENCED_SYSTEM_CHECKS=["tasklock.W002"]):
        call_command("check", stdout=out, stderr=err)
    assert "tasklock.W002" not in out.getvalue() + err.getvalue()
    assert "1 silenced" in out.getvalue() + err.getvalue()


def test_a_celery_tasklock_url_that_names_no_database_number_is_refused() -> None:
    from celery import Celery

    app = Celery("abc", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    refused = r"^Celery app\.conf: url=.*database '/abc'"
    with (
        override_settings(CELERY_TASKLOCK_URL=NOT_A_DATABASE),
        pytest.raises(ConfigurationError, match=refused),
    ):
        config.resolve_options({}, app.conf)


# -- no Redis anywhere: the error names every place a URL can be set, TASKLOCK["URL"] too ------


def test_no_redis_configured_names_the_tasklock_setting() -> None:
    guard = Guard(settle, "shop.nowhere", {})
    with pytest.raises(ConfigurationError, match="no Redis configured") as failure:
        run_guarded(guard, (1,), lambda extra: pytest.fail("ran without a lock"))
    message = str(failure.value)
    for place in ("url=", "TASKLOCK['URL']", "CELERY_TASKLOCK_URL", "TASKLOCK_URL environment"):
        assert place in message


# -- first use, outside the checks (celery worker, rq worker) ------------------------------------


def test_invalid_setting_raises_improperly_configured_on_first_use() -> None:
    guard = Guard(settle, "shop.settle", {})  # decorated at import time, before settings are read
    with override_settings(TASKLOCK={"URL": "redis://a:6379/0", "TTL": 0, "ON_DUPLICATE": "x"}):
        with pytest.raises(ImproperlyConfigured) as failure:
            guard.options  # noqa: B018
        message = str(failure.value)
        for fragment in ("[tasklock.E002]", "[tasklock.E003]", "['TTL']", "['ON_DUPLICATE']"):
            assert fragment in message
        assert isinstance(failure.value, ConfigurationError)
        with pytest.raises(ImproperlyConfigured):
            run_guarded(guard, (1,), lambda extra: pytest.fail("ran with a broken setting"))
    assert guard.options.ttl == 30.0


def test_risky_setting_is_logged_once_on_first_use(caplog: pytest.LogCaptureFixture) -> None:
    from tasklock.django.settings import read_tasklock_setting

    setting = {"URL": "redis://a:6379/0", "ON_BACKEND_ERROR": "run", "PENDING_TTL": 61.5}
    with override_settings(TASKLOCK=setting), caplog.at_level(logging.WARNING, "tasklock"):
        assert read_tasklock_setting()["on_backend_error"] == "run"
        assert read_tasklock_setting()["pending_ttl"] == 61.5
    logged = [r.getMessage() for r in caplog.records if "tasklock.W002" in r.getMessage()]
    assert len(logged) == 1
    assert "TASKLOCK['ON_BACKEND_ERROR']" in logged[0]


# -- override_settings reaches tasks that already resolved their options -------------------------


def test_override_settings_changes_what_a_task_resolves(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = Guard(settle, "shop.settle", {"fencing": True})
    assert (guard.options.ttl, guard.options.url) == (30.0, None)  # resolved and cached

    seen: list[tuple[list[bytes], int]] = []

    def body(extra: dict[str, Any]) -> str:
        keys = sorted(r.keys("*"))
        lock_key = next(k for k in keys if b":lock:" in k)
        seen.append((keys, r.pttl(lock_key)))
        return settle(1, **extra)

    with override_settings(TASKLOCK={"URL": redis_server.url, "TTL": 7, "KEY_PREFIX": "shop"}):
        assert (guard.options.ttl, guard.options.url) == (7.0, redis_server.url)
        assert guard.options.sources["ttl"] == "Django TASKLOCK"
        assert run_guarded(guard, (1,), body) == "settled 1"
        with override_settings(TASKLOCK={"URL": redis_server.url, "KEY_PREFIX": "other"}):
            assert (guard.options.ttl, guard.options.key_prefix) == (30.0, "other")
        assert guard.options.key_prefix == "shop"
    assert (guard.options.ttl, guard.options.url, guard.options.key_prefix) == (
        30.0,
        None,
        "tasklock",
    )
    [(keys, pttl)] = seen
    assert keys[0] == b"shop:{shop.settle}:fence"
    assert keys[1].startswith(b"shop:{shop.settle}:lock:")
    assert 0 < pttl <= 7000
    assert r.keys("*") == [b"shop:{shop.settle}:fence"]


def test_tasks_resolve_nothing_from_django_after_the_override_ends() -> None:
    with override_settings(TASKLOCK={"TTL": 9}):
        assert config.resolve_options({}).ttl == 9
    options = config.resolve_options({})
    assert options.ttl == 30.0
    assert "Django TASKLOCK" not in options.sources.values()


# -- precedence: task options > TASKLOCK > Celery app.conf > environment > defaults ---------------


def test_precedence_of_every_source(monkeypatch: pytest.MonkeyPatch) -> None:
    from celery import Celery

    app = Celery("precedence", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")

    def resolve(explicit: dict[str, Any]) -> config.TaskOptions:
        return config.resolve_options(explicit, app.conf)

    options = resolve({})
    assert (options.ttl, options.url, options.key_prefix) == (30.0, None, "tasklock")
    assert set(options.sources.values()) == {"defaults"}

    monkeypatch.setenv("TASKLOCK_URL", "redis://from-env:6379/0")
    monkeypatch.setenv("TASKLOCK_KEY_PREFIX", "env")
    options = resolve({})
    assert (options.url, options.key_prefix, options.ttl) == ("redis://from-env:6379/0", "env", 30)
    assert options.sources["url"] == options.sources["key_prefix"] == "environment"

    celery_settings = {
        "CELERY_TASKLOCK_TTL": 45,
        "CELERY_TASKLOCK_KEY_PREFIX": "celery",
        "CELERY_TASKLOCK_ON_DUPLICATE": "raise",
    }
    with override_settings(**celery_settings):
        options = resolve({})
        assert (options.ttl, options.key_prefix, options.on_duplicate) == (45, "celery", "raise")
        assert options.url == "redis://from-env:6379/0"
        assert options.sources["ttl"] == options.sources["key_prefix"] == "Celery app.conf"

        with override_settings(TASKLOCK={"TTL": 20, "URLS": REDLOCK}):
            options = resolve({})
            assert (options.ttl, options.urls, options.url) == (20, tuple(REDLOCK), None)
            assert (options.key_prefix, options.on_duplicate) == ("celery", "raise")
            assert options.sources["ttl"] == options.sources["urls"] == "Django TASKLOCK"
            assert options.sources["on_duplicate"] == "Celery app.conf"

            options = resolve({"ttl": 5, "url": "redis://task:6379/0", "on_duplicate": "wait"})
            assert (options.ttl, options.url, options.urls) == (5, "redis://task:6379/0", None)
            assert options.on_duplicate == "wait"
            assert options.key_prefix == "celery"
            assert options.sources["ttl"] == options.sources["url"] == "task options"


# -- end to end: a Celery task and a django-rq job configured only from TASKLOCK -----------------


@pytest.fixture
def project_redis(r: redis.Redis, redis_server: RedisServer) -> Iterator[redis.Redis]:
    """The project's Redis settings pointed at the module's server; yields a client to the locks'
    database (TASKLOCK["URL"] is database 1, the queues use database 0)."""
    with override_settings(**redis_settings(redis_server.url)):
        locks = redis_server.client(db=1, socket_timeout=30)  # > the BLPOP waits below
        yield locks
        locks.close()


def test_celery_task_takes_every_option_from_tasklock(
    project_redis: redis.Redis, redis_server: RedisServer
) -> None:
    from celery.result import AsyncResult

    from tasklock.celery import DUPLICATE
    from tests.django_project.celery import app
    from tests.django_project.shop import tasks
    from tests.integration.celery.support import in_process_worker

    # The shared task lives on every app; this one is not the current app, so look it up there.
    settle = app.tasks[tasks.settle.name]
    prefix = "shop:{tests.django_project.shop.tasks.settle}:lock:"
    with in_process_worker(app):
        first = settle.delay(1)
        try:
            assert project_redis.blpop(["shop:settle:started"], timeout=20) == (
                b"shop:settle:started",
                b"1",
            )
            twin = settle.delay(1)
            eventually(
                lambda: AsyncResult(twin.id, app=app).state == DUPLICATE,
                timeout=20,
                what="the twin recorded as DUPLICATE",
            )
            info = AsyncResult(twin.id, app=app).info
            assert info["key"].startswith(prefix)
        finally:
            project_redis.rpush("shop:settle:finish:1", 1)
        result = first.get(timeout=20)
    assert result["account_id"] == 1
    [(key, ttl_left)] = result["locks"].items()
    assert key == info["key"]
    assert 0 < ttl_left <= 20_000  # TASKLOCK["TTL"] = 20, not the default 30
    assert project_redis.lrange("shop:settle:started", 0, -1) == []  # the twin never started
    assert not project_redis.exists(key)
    fleet.flush()  # its counts too go to TASKLOCK's URL, not the broker's
    # (Earlier tests of this module lock other tasks on db 0 on purpose.)
    assert redis_server.client(db=0).keys("shop:{tests.django_project.shop.tasks.settle}:*") == []
    assert project_redis.exists("shop:{tests.django_project.shop.tasks.settle}:stats")


def test_django_rq_job_takes_every_option_from_tasklock(
    project_redis: redis.Redis, redis_server: RedisServer
) -> None:
    import django_rq
    from rq.job import JobStatus

    import tasklock
    from tests.django_project.shop import jobs
    from tests.integration.rq.support import drain

    queue = django_rq.get_queue("default")
    guard = jobs.reserve.tasklock.guard
    key = guard.lock_key((1,), {})
    assert key.startswith("shop:{tests.django_project.shop.jobs.reserve}:lock:")
    holder = tasklock.Lock(project_redis, key, timeout=60, fence_key=guard.fence_key)
    assert holder.acquire(blocking=False)
    try:
        skipped, other = jobs.reserve.delay(1), jobs.reserve.delay(2)
        drain(queue)
        assert skipped.get_status(refresh=True) == JobStatus.FINISHED
        skipped.refresh()
        assert skipped.meta["tasklock"]["outcome"] == "skipped"
        assert skipped.meta["tasklock"]["duplicate"]["key"] == key
        ran = other.return_value()
        assert ran["item_id"] == 2
        held = dict(ran["locks"])
        assert held.pop(key) > 20_000  # the test's own hold (60 s), still there
        [(other_key, ttl_left)] = held.items()
        assert other_key.startswith("shop:{tests.django_project.shop.jobs.reserve}:lock:")
        assert 0 < ttl_left <= 20_000  # TASKLOCK["TTL"] = 20, not the default 30

        # The policy follows the setting, also for a job function imported long ago.
        with override_settings(TASKLOCK={**settings_tasklock(), "ON_DUPLICATE": "raise"}):
            failed = jobs.reserve.delay(1)
            drain(queue)
            assert failed.get_status(refresh=True) == JobStatus.FAILED
            assert "DuplicateJob" in (failed.latest_result().exc_string or "")
    finally:
        holder.release()
    again = jobs.reserve.delay(1)
    drain(queue)
    assert again.return_value()["item_id"] == 1
    assert queue.connection.lrange("shop:reserved", 0, -1) == [b"2", b"1"]
    assert redis_server.client(db=0).keys("shop:*:lock:*") == []  # TASKLOCK's URL, not RQ's


def test_an_amqp_broker_and_no_url_names_the_tasklock_setting_under_django() -> None:
    from celery import Celery

    from tasklock.celery import singleton_task

    # Never connected to: the scheme alone says it is no Redis.
    app = Celery("amqp", broker="amqp://guest:secret@127.0.0.1:5672//", set_as_current=False)

    @singleton_task(app=app, shared=False)
    def refund(account_id: int) -> int:
        return account_id

    with pytest.raises(ConfigurationError, match="amqp://") as failure:
        refund(1)
    assert "TASKLOCK['URL']" in str(failure.value)
