"""``dedupe_enqueue="until_start"``: which values the option takes, and the policies it refuses
(where they are given: at decoration for task options, at first use across settings layers)."""

from __future__ import annotations

from typing import Any

import pytest

from tasklock.config import check_options, resolve_options, validate_options
from tasklock.errors import ConfigurationError


def report(customer_id: int) -> None: ...


def report_job(customer_id: int) -> None: ...


KEEPS_THE_QUEUED_RUN: list[dict[str, Any]] = [
    {"on_duplicate": "retry"},
    {"on_duplicate": "wait", "on_wait_timeout": "retry"},
    {"on_duplicate": "wait", "wait_timeout": None},
    {"on_duplicate": "wait", "wait_timeout": None, "on_wait_timeout": "skip"},
]

DROPS_THE_QUEUED_RUN: list[tuple[dict[str, Any], str]] = [
    ({}, "needs on_duplicate='wait' or 'retry', got 'skip'"),
    ({"on_duplicate": "skip"}, "needs on_duplicate='wait' or 'retry', got 'skip'"),
    ({"on_duplicate": "raise"}, "needs on_duplicate='wait' or 'retry', got 'raise'"),
    ({"on_duplicate": "wait"}, "on_wait_timeout='raise': a run in progress longer than"),
    (
        {"on_duplicate": "wait", "wait_timeout": 5, "on_wait_timeout": "skip"},
        "wait_timeout=5 s would make the queued run be skipped",
    ),
]


@pytest.mark.parametrize("value", [False, True, "until_start"])
def test_dedupe_enqueue_takes_false_true_and_until_start(value: Any) -> None:
    options = {"dedupe_enqueue": value, "on_duplicate": "retry"}
    assert validate_options(options) == options
    assert resolve_options(options).dedupe_enqueue == value


@pytest.mark.parametrize("value", [1, 0, "yes", "until_end", "UNTIL_START", None, ["until_start"]])
def test_any_other_dedupe_enqueue_is_an_error_naming_the_option(value: Any) -> None:
    with pytest.raises(ConfigurationError) as error:
        validate_options({"dedupe_enqueue": value}, "options of task t")
    assert str(error.value).startswith(
        f"options of task t: dedupe_enqueue must be False, True or 'until_start', got {value!r}"
    )
    [problem] = check_options({"dedupe_enqueue": value})
    assert problem.code == "E004"


@pytest.mark.parametrize("policies", KEEPS_THE_QUEUED_RUN)
def test_until_start_takes_the_policies_that_run_the_queued_call(policies: dict[str, Any]) -> None:
    options = {"dedupe_enqueue": "until_start", **policies}
    assert not check_options(options)
    assert resolve_options(options).dedupe_enqueue == "until_start"


@pytest.mark.parametrize(("policies", "fragment"), DROPS_THE_QUEUED_RUN)
def test_until_start_refuses_a_policy_that_drops_the_queued_call(
    policies: dict[str, Any], fragment: str
) -> None:
    options = {"dedupe_enqueue": "until_start", **policies}
    with pytest.raises(ConfigurationError, match=fragment.replace("(", r"\(")) as error:
        validate_options(options, "options of task t")
    message = str(error.value)
    assert message.startswith("options of task t: dedupe_enqueue='until_start'")
    assert "on_duplicate='retry'" in message  # what to use instead
    [problem] = check_options(options)
    assert (problem.option, problem.code, problem.warning) == ("dedupe_enqueue", "E010", False)


def test_true_keeps_every_policy() -> None:
    for policy in ("skip", "raise", "retry", "wait"):
        assert not check_options({"dedupe_enqueue": True, "on_duplicate": policy})


def test_a_refused_combination_across_layers_fails_at_first_use_naming_the_sources() -> None:
    project = {"tasklock_dedupe_enqueue": "until_start", "tasklock_on_duplicate": "retry"}
    assert resolve_options({}, project).dedupe_enqueue == "until_start"
    with pytest.raises(ConfigurationError) as error:
        resolve_options({"on_duplicate": "skip"}, project)
    message = str(error.value)
    assert "needs on_duplicate='wait' or 'retry', got 'skip'" in message
    assert "dedupe_enqueue='until_start' (Celery app.conf)" in message
    assert "on_duplicate='skip' (task options)" in message


def test_celery_decorator_refuses_skip_with_until_start() -> None:
    pytest.importorskip("celery")
    from tasklock.celery import singleton_task

    with pytest.raises(ConfigurationError, match="needs on_duplicate='wait' or 'retry'"):
        singleton_task(name="unit.until_start.skip", dedupe_enqueue="until_start")(report)
    with pytest.raises(ConfigurationError, match="on_wait_timeout='raise'"):
        singleton_task(
            name="unit.until_start.wait", dedupe_enqueue="until_start", on_duplicate="wait"
        )(report)
    task = singleton_task(
        name="unit.until_start.retry", dedupe_enqueue="until_start", on_duplicate="retry"
    )(report)
    assert task.tasklock_guard.explicit["dedupe_enqueue"] == "until_start"


def test_rq_decorator_refuses_skip_with_until_start() -> None:
    pytest.importorskip("rq")
    from tasklock.rq import singleton_job

    with pytest.raises(ConfigurationError, match="needs on_duplicate='wait' or 'retry'"):
        singleton_job(dedupe_enqueue="until_start", on_duplicate="raise")(report_job)
    with pytest.raises(ConfigurationError, match="dedupe_enqueue must be False, True or"):
        singleton_job(dedupe_enqueue="always")(report_job)
    job = singleton_job(dedupe_enqueue="until_start", on_duplicate="wait", wait_timeout=None)(
        report_job
    )
    assert job.tasklock.guard.options.dedupe_enqueue == "until_start"
