"""Django's ``TASKLOCK`` for the rate options: ``RATE``, ``BURST``, ``RATE_GROUP`` and
``ON_RATE_LIMIT`` are accepted project-wide and validated by the system checks (``tasklock.E013``,
``E015``; ``RATE_KEY`` is a task option, ``E008``), and a task reads them."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import override_settings

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


def notify(tenant_id: int) -> None: ...


def ids(setting: dict[str, Any]) -> list[tuple[str, str]]:
    with override_settings(TASKLOCK=setting):
        return sorted((m.id or "", m.msg) for m in run_checks(tags=["tasklock"]))


def test_a_project_rate_is_accepted_and_read_by_tasks() -> None:
    setting = {
        "URL": URL,
        "RATE": ["10/s", "1000/d"],
        "BURST": [5, 1000],
        "RATE_GROUP": "mailer",
        "ON_RATE_LIMIT": "wait",
    }
    assert ids(setting) == []
    with override_settings(TASKLOCK=setting):
        options = Guard(notify, "app.notify", {}).options
    assert (options.rate, options.burst) == (["10/s", "1000/d"], [5, 1000])
    assert (options.rate_group, options.on_rate_limit) == ("mailer", "wait")
    assert options.sources["rate"] == "Django TASKLOCK"


@pytest.mark.parametrize(
    ("setting", "check_id", "words"),
    [
        ({"RATE": "10/fortnight"}, "tasklock.E013", "TASKLOCK['RATE']"),
        ({"RATE": "5/s", "BURST": [1, 2]}, "tasklock.E013", "TASKLOCK['BURST']"),
        ({"RATE": "5/s", "URLS": REDLOCK}, "tasklock.E015", "Redlock"),
        ({"RATE_KEY": ["tenant_id"]}, "tasklock.E008", "RATE_KEY"),
        ({"ON_RATE_LIMIT": "later"}, "tasklock.E003", "ON_RATE_LIMIT"),
    ],
)
def test_each_wrong_rate_setting_is_its_own_check_message(
    setting: dict[str, Any], check_id: str, words: str
) -> None:
    [(found, message)] = ids(setting)
    assert found == check_id
    assert words in message
