"""Option validation names the option; resolution follows the documented precedence."""

from __future__ import annotations

from typing import Any

import pytest

from tasklock.config import DEFAULTS, check_options, resolve_options, validate_options
from tasklock.errors import ConfigurationError


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"ttl": 0}, "ttl must be a number of seconds > 0"),
        ({"ttl": -5}, "ttl"),
        ({"ttl": "30"}, "ttl"),
        ({"ttl": True}, "ttl"),
        ({"ttl": float("inf")}, "ttl"),
        ({"pending_ttl": 0}, "pending_ttl"),
        ({"wait_timeout": -1}, "wait_timeout"),
        (
            {"on_duplicate": "ignore"},
            "on_duplicate must be one of 'skip', 'raise', 'retry', 'wait'",
        ),
        ({"on_wait_timeout": "wait"}, "on_wait_timeout"),
        ({"on_backend_error": "skip"}, "on_backend_error"),
        ({"dedupe_enqueue": "yes"}, "dedupe_enqueue"),
        ({"watchdog": 1}, "watchdog"),
        ({"fencing": "not an identifier"}, "fencing"),
        ({"key": "account_id"}, "key must be None, a list"),
        ({"key": [1]}, "key must list argument names"),
        ({"key_prefix": ""}, "key_prefix"),
        ({"url": "localhost:6379"}, "url='localhost:6379' is not a Redis, etcd or ZooKeeper URL"),
        ({"urls": ["redis://a", "redis://a", "redis://b"]}, "same server twice"),
        ({"urls": ["redis://a", "redis://b"]}, "tolerates 0 failed"),
        ({"urls": ["redis://a", "redis://b", "redis://c", "redis://d"]}, "use an odd number"),
        ({"urls": "redis://a"}, "urls must be a non-empty list"),
        ({"url": "redis://a", "urls": ["redis://b"]}, "url and urls are both set"),
        ({"tll": 30}, "unknown option 'tll'"),
    ],
)
def test_bad_options_are_named(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        validate_options(options, "options of task t")


def test_error_names_the_source() -> None:
    with pytest.raises(ConfigurationError, match="^options of task app.x: ttl"):
        validate_options({"ttl": 0}, "options of task app.x")


def test_task_only_options_are_errors_project_wide() -> None:
    problems = check_options({"key": ["a"], "fencing": True}, "TASKLOCK", project_wide=True)
    assert {p.code for p in problems} == {"E008"}
    assert not check_options({"key": ["a"], "fencing": True})


def test_risky_but_legal_settings_are_warnings() -> None:
    problems = check_options({"on_backend_error": "run", "watchdog": False, "ttl": 0.5})
    assert all(p.warning for p in problems)
    assert {p.code for p in problems} == {"W001", "W002", "W003"}
    validate_options({"on_backend_error": "run"})  # warnings do not raise


@pytest.mark.parametrize("name", ["ttl", "pending_ttl"])
@pytest.mark.parametrize("value", [0.0005, 0.000999, 1e-9])
def test_a_ttl_under_a_millisecond_is_an_error_where_it_is_given(name: str, value: float) -> None:
    # The lock core refuses it (Redis expires keys in whole milliseconds): a warning here let
    # the task be decorated and then fail on every call.
    with pytest.raises(ConfigurationError, match=f"{name} must be at least 0.001 seconds"):
        validate_options({name: value}, "options of task t")
    [problem] = check_options({name: value})
    assert (problem.code, problem.warning) == ("E002", False)
    assert "millisecond" in problem.hint


def test_the_ttl_floor_is_the_cores_and_under_a_second_only_warns() -> None:
    validate_options({"ttl": 0.001, "pending_ttl": 0.001})
    assert [(p.code, p.warning) for p in check_options({"ttl": 0.001})] == [("W001", True)]
    assert not check_options({"pending_ttl": 0.001})


def test_every_default_is_valid() -> None:
    assert not [p for p in check_options(DEFAULTS) if not p.warning]


def test_precedence_task_over_conf_over_env_over_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKLOCK_URL", "redis://env:6379/0")
    monkeypatch.setenv("TASKLOCK_KEY_PREFIX", "envprefix")
    resolved = resolve_options({}, None)
    assert (resolved.url, resolved.key_prefix, resolved.ttl) == (
        "redis://env:6379/0",
        "envprefix",
        30.0,
    )
    conf = {"tasklock_url": "redis://conf:6379/0", "tasklock_ttl": 10}
    resolved = resolve_options({}, conf)
    assert (resolved.url, resolved.ttl, resolved.key_prefix) == (
        "redis://conf:6379/0",
        10.0,
        "envprefix",
    )
    assert resolved.sources["url"] == "Celery app.conf"
    resolved = resolve_options({"ttl": 5, "url": "redis://task:6379/0"}, conf)
    assert (resolved.url, resolved.ttl) == ("redis://task:6379/0", 5.0)
    assert resolved.sources["ttl"] == "task options"


def test_django_style_upper_case_celery_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TASKLOCK_URL", raising=False)
    resolved = resolve_options({}, {"TASKLOCK_URL": "redis://upper:6379/0"})
    assert resolved.url == "redis://upper:6379/0"


def test_urls_in_a_higher_layer_replace_a_lower_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKLOCK_URL", "redis://env:6379/0")
    urls = ["redis://a:1/0", "redis://b:1/0", "redis://c:1/0"]
    resolved = resolve_options({"urls": urls}, None)
    assert resolved.url is None
    assert resolved.urls == tuple(urls)


def test_bad_project_wide_value_names_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKLOCK_URL", "localhost")
    with pytest.raises(ConfigurationError, match="^environment: url"):
        resolve_options({}, None)
    monkeypatch.delenv("TASKLOCK_URL")
    with pytest.raises(ConfigurationError, match="^Celery app.conf: on_duplicate"):
        resolve_options({}, {"tasklock_on_duplicate": "nope"})


def test_fence_keyword() -> None:
    assert resolve_options({"fencing": True}).fence_keyword == "fence_token"
    assert resolve_options({"fencing": "token"}).fence_keyword == "token"
    assert resolve_options({}).fence_keyword is None
