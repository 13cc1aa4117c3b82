"""Django's ``TASKLOCK['URL']`` may name etcd: the system checks accept it, report what etcd
cannot serve as their own messages (``tasklock.E016`` rate, ``E017`` a sub-second TTL,
``E006`` a malformed etcd URL or etcd in ``URLS``), and a task reads it."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from tasklock.guard import Guard

ETCD = "etcd://etcd1:2379,etcd2:2379,etcd3:2379"


@pytest.fixture(scope="module", autouse=True)
def django_project() -> None:
    from tests.django_project import setup

    setup()


@pytest.fixture(autouse=True)
def no_tasklock_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TASKLOCK_URL", "TASKLOCK_URLS", "TASKLOCK_KEY_PREFIX"):
        monkeypatch.delenv(name, raising=False)


def settle(account_id: int) -> None: ...


def ids(setting: dict[str, Any]) -> list[tuple[str, str]]:
    with override_settings(TASKLOCK=setting):
        return sorted((m.id or "", m.msg) for m in run_checks(tags=["tasklock"]))


def test_an_etcd_url_is_accepted_and_read_by_tasks() -> None:
    setting = {"URL": ETCD, "TTL": 10, "DEDUPE_ENQUEUE": True}
    assert ids(setting) == []
    with override_settings(TASKLOCK=setting):
        guard = Guard(settle, "app.settle", {})
        assert guard.options.url == ETCD
        assert type(guard.lock_for("k")).__module__ == "tasklock.etcd.lock"


@pytest.mark.parametrize(
    ("setting", "check_id", "words"),
    [
        ({"URL": ETCD, "RATE": "5/s"}, "tasklock.E016", "rate with an etcd url"),
        ({"URL": ETCD, "TTL": 0.5}, "tasklock.E017", "whole seconds"),
        ({"URL": "etcd://etcd1:99999"}, "tasklock.E006", "invalid port"),
        ({"URLS": ["etcd://a:2379", "redis://b:6379/0"]}, "tasklock.E006", "mixes etcd"),
    ],
)
def test_what_etcd_cannot_serve_is_its_own_check_message(
    setting: dict[str, Any], check_id: str, words: str
) -> None:
    found = [(check, message) for check, message in ids(setting) if check != "tasklock.W001"]
    assert found, "no check message"
    assert {check for check, _ in found} == {check_id}
    assert all(words.lower() in message.lower() for _, message in found), found
