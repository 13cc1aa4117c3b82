"""Mistakes in @singleton_job fail when the module is imported, naming what is wrong."""

from __future__ import annotations

from typing import Any

import pytest

from tasklock.errors import ConfigurationError
from tasklock.rq import singleton_job
from tests.integration.rq import jobs


def settle(account_id: int, day: str) -> None: ...


def fenced(account_id: int, fence: int | None = None) -> None: ...


async def coroutine_job(name: str) -> None: ...


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"on_duplicate": "ignore"},
            r"on_duplicate must be one of 'skip', 'raise', 'retry', 'wait'",
        ),
        ({"ttl": 0}, r"ttl must be a number of seconds > 0, got 0"),
        ({"ttl": -5}, r"ttl must be a number of seconds > 0, got -5"),
        ({"ttl": "30"}, r"ttl must be a number of seconds > 0, got '30'"),
        ({"tll": 30}, r"unknown option 'tll'"),
        ({"on_backend_error": "ignore"}, r"on_backend_error must be one of 'raise', 'run'"),
        ({"dedupe_enqueue": "yes"}, r"dedupe_enqueue must be False, True or 'until_start'"),
        (
            {"url": "http://localhost:6379"},
            r"url=.http://localhost:6379. is not a Redis, etcd or ZooKeeper",
        ),
        ({"key": ["account"]}, r"key names argument 'account', but .*settle takes"),
        ({"key": "account_id"}, r"key must be None, a list of argument names or a callable"),
        ({"fencing": True}, r"fencing passes fence_token= to .*settle, but it does not accept"),
        ({"fencing": "token"}, r"fencing passes token= to .*settle"),
    ],
)
def test_bad_options_fail_at_decoration(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        singleton_job(**options)(settle)


def test_fencing_keyword_that_the_function_takes_is_fine() -> None:
    job = singleton_job(fencing="fence")(fenced)
    assert job.tasklock.guard.fence_keyword == "fence"


def test_functions_rq_cannot_import_are_refused() -> None:
    def nested(name: str) -> None: ...

    with pytest.raises(ConfigurationError, match=r"module-level function.*<locals>\.nested"):
        singleton_job(nested)
    with pytest.raises(ConfigurationError, match="module-level function"):
        singleton_job(lambda name: None)


def test_async_jobs_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="does not support async def jobs"):
        singleton_job(coroutine_job)


def test_decorator_misuse() -> None:
    with pytest.raises(ConfigurationError, match=r"decorates functions, got 'settle'"):
        singleton_job("settle")  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="not both"):
        singleton_job(settle, ttl=3)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="already a singleton job"):
        singleton_job(jobs.settle)
