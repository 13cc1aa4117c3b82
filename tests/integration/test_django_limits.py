"""Django's ``TASKLOCK`` for ``LIMIT`` (checks ``tasklock.E011``, ``E012``) and "one running + one
queued" (``DEDUPE_ENQUEUE = "until_start"``, check ``tasklock.E010``), and the same validation at
first use, where checks do not run.

Django is configured as in ``test_django.py`` (``tests/django_project``, without ``TASKLOCK``);
each test sets ``TASKLOCK`` with ``override_settings``.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from tasklock import config
from tasklock.errors import ConfigurationError
from tasklock.guard import Guard

URL = "redis://cache.internal:6379/0"
REDLOCK = ["redis://n1:6379/0", "redis://n2:6379/0", "redis://n3:6379/0"]


@pytest.fixture(scope="module", autouse=True)
def django_project() -> None:
    from tests.django_project import setup

    setup()


@pytest.fixture(autouse=True)
def no_tasklock_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TASKLOCK_URL", "TASKLOCK_URLS", "TASKLOCK_KEY_PREFIX"):
        monkeypatch.delenv(name, raising=False)


def report(customer_id: int) -> None: ...


def messages(setting: dict[str, Any]) -> list[tuple[str, str, str]]:
    with override_settings(TASKLOCK=setting):
        return sorted((m.id or "", m.msg, m.hint or "") for m in run_checks(tags=["tasklock"]))


@pytest.mark.parametrize(
    "setting",
    [
        {"DEDUPE_ENQUEUE": "until_start", "ON_DUPLICATE": "retry"},
        {"DEDUPE_ENQUEUE": "until_start", "ON_DUPLICATE": "wait", "ON_WAIT_TIMEOUT": "retry"},
        {"DEDUPE_ENQUEUE": "until_start", "ON_DUPLICATE": "wait", "WAIT_TIMEOUT": None},
    ],
)
def test_until_start_is_a_valid_setting_with_a_policy_that_keeps_the_queued_run(
    setting: dict[str, Any],
) -> None:
    assert messages({"URL": URL, **setting}) == []
    with override_settings(TASKLOCK={"URL": URL, **setting}):
        assert config.resolve_options({}).dedupe_enqueue == "until_start"


@pytest.mark.parametrize(
    ("setting", "fragment"),
    [
        ({"DEDUPE_ENQUEUE": "until_start"}, "needs ON_DUPLICATE='wait' or 'retry', got 'skip'"),
        (
            {"DEDUPE_ENQUEUE": "until_start", "ON_DUPLICATE": "raise"},
            "needs ON_DUPLICATE='wait' or 'retry', got 'raise'",
        ),
        (
            {"DEDUPE_ENQUEUE": "until_start", "ON_DUPLICATE": "wait"},
            "ON_WAIT_TIMEOUT='raise': a run in progress longer than WAIT_TIMEOUT=30.0",
        ),
    ],
)
def test_until_start_with_a_policy_that_drops_the_queued_run_is_e010(
    setting: dict[str, Any], fragment: str
) -> None:
    [(check_id, message, hint)] = messages({"URL": URL, **setting})
    assert check_id == "tasklock.E010"
    assert message.startswith("TASKLOCK['DEDUPE_ENQUEUE']: DEDUPE_ENQUEUE='until_start'")
    assert fragment in message
    assert "ON_DUPLICATE='retry'" in hint
    # Workers run no checks: the same error when a task first reads the setting.
    guard = Guard(report, "shop.report", {})
    with (
        override_settings(TASKLOCK={"URL": URL, **setting}),
        pytest.raises(ImproperlyConfigured, match=r"\[tasklock\.E010\]"),
    ):
        guard.options  # noqa: B018


@pytest.mark.parametrize("value", [1, "yes", "until_end"])
def test_any_other_dedupe_enqueue_is_e004(value: Any) -> None:
    [(check_id, message, hint)] = messages({"URL": URL, "DEDUPE_ENQUEUE": value})
    assert check_id == "tasklock.E004"
    assert message == (
        f"TASKLOCK['DEDUPE_ENQUEUE']: DEDUPE_ENQUEUE must be False, True or 'until_start', "
        f"got {value!r}"
    )
    assert hint


def test_a_task_policy_that_drops_the_queued_run_fails_at_first_use_naming_both_sources() -> None:
    setting = {"URL": URL, "DEDUPE_ENQUEUE": "until_start", "ON_DUPLICATE": "retry"}
    guard = Guard(report, "shop.report", {"on_duplicate": "skip"})  # fine on its own
    with override_settings(TASKLOCK=setting):
        assert messages(setting) == []
        with pytest.raises(ConfigurationError) as failure:
            guard.options  # noqa: B018
    message = str(failure.value)
    assert "dedupe_enqueue='until_start' (Django TASKLOCK)" in message
    assert "on_duplicate='skip' (task options)" in message


# -- LIMIT ---------------------------------------------------------------------------------------
def test_limit_is_a_valid_setting() -> None:
    assert messages({"URL": URL, "LIMIT": 4}) == []
    with override_settings(TASKLOCK={"URL": URL, "LIMIT": 4}):
        options = config.resolve_options({})
        assert (options.limit, options.sources["limit"]) == (4, "Django TASKLOCK")
        assert config.resolve_options({"limit": 1}).limit == 1  # the task's own wins


@pytest.mark.parametrize("value", [0, -2, True, 2.5, "3"])
def test_a_limit_that_is_no_whole_number_from_one_is_e011(value: Any) -> None:
    [(check_id, message, hint)] = messages({"URL": URL, "LIMIT": value})
    assert check_id == "tasklock.E011"
    assert message == (
        "TASKLOCK['LIMIT']: LIMIT must be a whole number >= 1 (bodies at once per key) or None "
        f"(no execution lock), got {value!r}"
    )
    assert hint


def test_limit_with_urls_is_e012_saying_why() -> None:
    [(check_id, message, hint)] = messages({"URLS": REDLOCK, "LIMIT": 3})
    assert check_id == "tasklock.E012"
    assert message.startswith("TASKLOCK['LIMIT']: LIMIT=3 with URLS (Redlock) is refused")
    assert "a majority of the masters only" in message
    assert hint.startswith("use URL=")
    assert messages({"URLS": REDLOCK, "LIMIT": 1}) == []


def test_a_task_limit_with_the_projects_urls_fails_at_first_use_naming_both_sources() -> None:
    guard = Guard(report, "shop.report", {"limit": 3})
    with (
        override_settings(TASKLOCK={"URLS": REDLOCK}),
        pytest.raises(ConfigurationError) as failure,
    ):
        guard.options  # noqa: B018
    message = str(failure.value)
    assert "limit=3 (task options)" in message
    assert "(Django TASKLOCK)" in message
