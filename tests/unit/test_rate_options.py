"""The task layer's rate options (``rate``, ``burst``, ``rate_key``, ``rate_group``,
``on_rate_limit``, ``limit=None``): defaults, validation at decoration, and the combinations
that are refused wherever each value came from."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tasklock.config import (
    DEFAULTS,
    TASK_ONLY_OPTIONS,
    check_options,
    resolve_options,
    validate_options,
)
from tasklock.errors import ConfigurationError
from tasklock.guard import Guard

URL = "redis://cache.internal:6379/0"
REDLOCK = ["redis://n1:6379/0", "redis://n2:6379/0", "redis://n3:6379/0"]


def charge(tenant_id: int, invoice_id: int) -> None: ...


def test_defaults_leave_a_task_unlimited_and_retry_when_a_rate_is_set() -> None:
    assert DEFAULTS["rate"] is None
    assert DEFAULTS["burst"] == 1
    assert DEFAULTS["on_rate_limit"] == "retry"
    options = resolve_options({})
    assert (options.rate, options.rate_key, options.rate_group) == (None, None, None)
    assert "rate_key" in TASK_ONLY_OPTIONS


@pytest.mark.parametrize(
    "options",
    [
        {"rate": "20/m"},
        {"rate": "30/5m", "burst": 10},
        {"rate": ["10/s", "100000/d"], "burst": [1, 100000]},
        {"rate": "5/s", "on_rate_limit": "wait", "wait_timeout": 2},
        {"rate": "5/s", "rate_key": ["tenant_id"], "rate_group": "stripe"},
        {"rate": "5/s", "rate_key": [], "limit": None},
        {"rate": "5/s", "rate_key": lambda tenant_id, invoice_id: tenant_id},
    ],
)
def test_valid_rate_options(options: dict[str, Any]) -> None:
    assert [p for p in check_options(options) if not p.warning] == []
    Guard(charge, "app.charge", {"url": URL, **options})


@pytest.mark.parametrize(
    ("options", "option", "code", "words"),
    [
        ({"rate": "10/x"}, "rate", "E013", "rate='10/x' is not a rate"),
        ({"rate": "0/s"}, "rate", "E013", "admits nothing"),
        ({"rate": []}, "rate", "E013", "empty list"),
        ({"rate": ["1/s", "5/1s"]}, "rate", "E013", "same period"),
        ({"rate": True}, "rate", "E013", "must be a rate"),
        ({"rate": "5/s", "burst": 0}, "burst", "E013", "burst must be a whole number >= 1"),
        ({"rate": ["5/s", "9/m"], "burst": [2]}, "burst", "E013", "lists 1 values for 2"),
        ({"burst": 2.5}, "burst", "E013", "burst must be"),
        ({"rate": "5/s", "on_rate_limit": "later"}, "on_rate_limit", "E003", "on_rate_limit"),
        ({"rate_key": "tenant_id"}, "rate_key", "E005", "rate_key must be None, a list"),
        ({"rate_group": ""}, "rate_group", "E004", "rate_group must be a non-empty string"),
        ({"limit": None, "fencing": True}, "fencing", "E014", "fencing with limit=None"),
        ({"rate": "5/s", "urls": REDLOCK}, "rate", "E015", "rate with urls (Redlock)"),
    ],
)
def test_each_mistake_is_named(options: dict[str, Any], option: str, code: str, words: str) -> None:
    problems = [p for p in check_options(options, "options of task t") if not p.warning]
    assert [(p.option, p.code) for p in problems] == [(option, code)]
    assert words in problems[0].message
    assert problems[0].message.startswith("options of task t: ")
    with pytest.raises(ConfigurationError, match="options of task t: "):
        validate_options(options, "options of task t")


def test_rate_key_is_checked_against_the_signature_at_decoration() -> None:
    with pytest.raises(ConfigurationError, match="^rate_key names argument 'tenant'"):
        Guard(charge, "app.charge", {"url": URL, "rate": "5/s", "rate_key": ["tenant"]})


def test_rate_key_is_a_task_option_not_a_project_setting() -> None:
    [problem] = check_options({"rate_key": ["tenant_id"]}, "TASKLOCK", project_wide=True)
    assert problem.code == "E008"


def test_a_task_rate_with_project_urls_is_refused_naming_both_sources(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TASKLOCK_URLS", ",".join(REDLOCK))
    with pytest.raises(ConfigurationError) as error:
        resolve_options({"rate": "5/s"})
    message = str(error.value)
    assert "rate with urls (Redlock) is refused" in message
    assert "rate='5/s' (task options)" in message
    assert "(environment)" in message


def test_a_project_burst_list_must_match_a_task_rate_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigurationError, match=r"burst lists 2 values for 1 rate"):
        resolve_options({"rate": "5/s"}, {"tasklock_burst": [1, 2]})


def test_limit_none_from_the_task_overrides_a_project_limit() -> None:
    assert resolve_options({"limit": None}, {"tasklock_limit": 3}).limit is None
    assert resolve_options({}, {"tasklock_limit": 3}).limit == 3


def test_a_task_rate_none_overrides_a_project_rate() -> None:
    assert resolve_options({"rate": None}, {"tasklock_rate": "5/s"}).rate is None
    assert resolve_options({}, {"tasklock_rate": "5/s"}).rate == "5/s"


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"on_rate_limit": "skip"}, "on_rate_limit='skip' applies to a rate limit"),
        ({"burst": 5}, "burst=5 applies to a rate limit"),
        ({"rate_key": ["tenant_id"]}, "rate_key=['tenant_id'] applies to a rate limit"),
        ({"on_duplicate": "wait", "limit": None}, "on_duplicate='wait' waits for the execution"),
    ],
)
def test_a_task_option_that_nothing_uses_is_refused(options: dict[str, Any], words: str) -> None:
    """Accepted, these did nothing (issue 32): a task's own option for a rate it does not have,
    or a wait for a lock it turned off."""
    with pytest.raises(ConfigurationError, match=re.escape(words)):
        resolve_options({"url": URL, **options})


def test_the_same_in_project_settings_is_a_default_for_tasks_with_a_rate() -> None:
    conf = {"tasklock_on_rate_limit": "skip", "tasklock_burst": 5, "tasklock_on_duplicate": "wait"}
    assert resolve_options({"url": URL}, conf).on_rate_limit == "skip"
    assert resolve_options({"url": URL, "limit": None, "rate": "5/s"}, conf).burst == 5
