"""``limit=N``: a whole number >= 1, never with ``urls`` (Redlock), refused where it is given."""

from __future__ import annotations

from typing import Any

import pytest

from tasklock.config import DEFAULTS, check_options, resolve_options, validate_options
from tasklock.errors import ConfigurationError

REDLOCK = ["redis://n1:6379/0", "redis://n2:6379/0", "redis://n3:6379/0"]


def export(tenant_id: int) -> None: ...


def export_job(tenant_id: int) -> None: ...


def test_limit_defaults_to_one() -> None:
    assert DEFAULTS["limit"] == 1
    assert resolve_options({}).limit == 1


@pytest.mark.parametrize("value", [1, 2, 3, 1000])
def test_limit_takes_whole_numbers_from_one(value: int) -> None:
    assert not check_options({"limit": value})
    assert resolve_options({"limit": value}).limit == value


def test_limit_none_turns_the_execution_lock_off() -> None:
    assert not check_options({"limit": None})
    assert resolve_options({"limit": None}).limit is None


@pytest.mark.parametrize("value", [0, -1, True, False, 2.0, 2.5, "3", [3]])
def test_any_other_limit_is_an_error_naming_the_option(value: Any) -> None:
    with pytest.raises(ConfigurationError) as error:
        validate_options({"limit": value}, "options of task t")
    assert str(error.value).startswith(
        "options of task t: limit must be a whole number >= 1 (bodies at once per key) or None "
        f"(no execution lock), got {value!r}"
    )
    [problem] = check_options({"limit": value})
    assert (problem.option, problem.code, problem.warning) == ("limit", "E011", False)


@pytest.mark.parametrize("urls", [REDLOCK, REDLOCK[:1]])
def test_limit_above_one_with_urls_is_refused_saying_why(urls: list[str]) -> None:
    with pytest.raises(ConfigurationError) as error:
        validate_options({"limit": 3, "urls": urls}, "options of task t")
    message = str(error.value)
    assert message.startswith("options of task t: limit=3 with urls (Redlock) is refused")
    assert "each holder takes a permit on a majority of the masters only" in message
    assert "2 x limit - 1" in message
    assert "use url=" in message
    [problem] = check_options({"limit": 3, "urls": urls})
    assert (problem.option, problem.code) == ("limit", "E012")


def test_limit_one_with_urls_is_redlock_as_before() -> None:
    assert not check_options({"limit": 1, "urls": REDLOCK})


def test_limit_and_urls_from_different_layers_fail_at_first_use_naming_the_sources() -> None:
    project = {"tasklock_urls": REDLOCK}
    assert resolve_options({}, project).urls == tuple(REDLOCK)
    with pytest.raises(ConfigurationError) as error:
        resolve_options({"limit": 4}, project)
    message = str(error.value)
    assert "limit=4 with urls (Redlock) is refused" in message
    assert "limit=4 (task options)" in message
    assert "(Celery app.conf)" in message
    # A task's url replaces the project's urls: then a limit is fine.
    assert resolve_options({"limit": 4, "url": "redis://a:6379/0"}, project).limit == 4


def test_celery_decorator_validates_limit() -> None:
    pytest.importorskip("celery")
    from tasklock.celery import singleton_task

    with pytest.raises(ConfigurationError, match="limit must be a whole number >= 1"):
        singleton_task(name="unit.limit.zero", limit=0)(export)
    with pytest.raises(ConfigurationError, match=r"limit=3 with urls \(Redlock\) is refused"):
        singleton_task(name="unit.limit.redlock", limit=3, urls=REDLOCK)(export)
    task = singleton_task(name="unit.limit.three", limit=3, key=["tenant_id"])(export)
    assert task.tasklock_guard.explicit["limit"] == 3


def test_rq_decorator_validates_limit() -> None:
    pytest.importorskip("rq")
    from tasklock.rq import singleton_job

    with pytest.raises(ConfigurationError, match="limit must be a whole number >= 1"):
        singleton_job(limit=True)(export_job)
    with pytest.raises(ConfigurationError, match=r"limit=2 with urls \(Redlock\) is refused"):
        singleton_job(limit=2, urls=REDLOCK)(export_job)
    job = singleton_job(limit=3, on_duplicate="wait")(export_job)
    assert job.tasklock.guard.options.limit == 3
