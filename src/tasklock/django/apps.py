"""The Django app of tasklock: registers the system checks and the settings-change hook."""

from __future__ import annotations

from django.apps import AppConfig
from django.core import checks


class TaskLockConfig(AppConfig):
    """``INSTALLED_APPS += ["tasklock.django"]``. No models, no migrations."""

    name = "tasklock.django"
    label = "tasklock"
    verbose_name = "tasklock"

    def ready(self) -> None:
        from tasklock.django.checks import check_tasklock_setting
        from tasklock.django.settings import connect_signals

        checks.register(check_tasklock_setting, "tasklock")
        # override_settings(TASKLOCK=...) must reach tasks that already resolved their options.
        connect_signals()
