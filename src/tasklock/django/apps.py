"""The Django app of tasklock: registers the system checks and the settings-change hook, and
owns the fence table (the ``Fence`` model and its migration) behind
:func:`tasklock.django.fencing.fence`."""

from __future__ import annotations

from django.apps import AppConfig
from django.core import checks


class TaskLockConfig(AppConfig):
    """``INSTALLED_APPS += ["tasklock.django"]``.

    Two models. :class:`tasklock.django.models.Fence` (table ``tasklock_fence``) and its
    migration: ``manage.py migrate`` creates the table that ``fence()`` writes. A project that
    fences only with ``fenced_update`` (a column on its own rows) or not at all may leave the table
    empty; ``manage.py tasklock_prune_fences`` deletes old rows. And
    :class:`tasklock.django.models.HeldLock`, which has no table: with ``django.contrib.admin``
    installed it carries the admin page of held locks (:mod:`tasklock.django.admin`, found by
    the admin's autodiscovery) and its ``view_locks`` and ``release_locks`` permissions.
    """

    name = "tasklock.django"
    label = "tasklock"
    verbose_name = "tasklock"

    def ready(self) -> None:
        from tasklock.django.checks import check_tasklock_setting
        from tasklock.django.settings import connect_signals

        checks.register(check_tasklock_setting, "tasklock")
        # override_settings(TASKLOCK=...) must reach tasks that already resolved their options.
        connect_signals()
