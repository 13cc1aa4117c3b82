"""Where project-wide settings come from, besides a task's own options: the environment,
Celery's app.conf, Django's ``TASKLOCK``; and who is told when they change.

The task layer (:mod:`tasklock.config`) reads them here and never imports an adapter: the Django
adapter plugs its reader in (:func:`use_django_reader`, loaded by name the first time a process
that uses Django resolves a task's options), and the guards plug in what to do when settings
change (:func:`on_settings_changed`). So reading settings needs neither the guard nor an import
of an adapter, and nothing here imports anything of tasklock's.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "DJANGO_READER_MODULE",
    "celery_conf_options",
    "django_setting",
    "environment",
    "on_settings_changed",
    "settings_changed",
    "use_django_reader",
]


def environment() -> dict[str, Any]:
    """The ``TASKLOCK_URL``, ``TASKLOCK_URLS`` and ``TASKLOCK_KEY_PREFIX`` environment variables."""
    found: dict[str, Any] = {}
    if os.environ.get("TASKLOCK_URL"):
        found["url"] = os.environ["TASKLOCK_URL"]
    if os.environ.get("TASKLOCK_URLS"):
        found["urls"] = [u.strip() for u in os.environ["TASKLOCK_URLS"].split(",") if u.strip()]
    if os.environ.get("TASKLOCK_KEY_PREFIX"):
        found["key_prefix"] = os.environ["TASKLOCK_KEY_PREFIX"]
    return found


def celery_conf_options(conf: Mapping[str, Any] | None, names: Iterable[str]) -> dict[str, Any]:
    """``tasklock_<option>`` keys of a Celery app.conf (Django: CELERY_TASKLOCK_<OPTION>), for
    the option ``names``."""
    if conf is None:
        return {}
    found: dict[str, Any] = {}
    for name in names:
        for key in (f"tasklock_{name}", f"TASKLOCK_{name.upper()}"):
            value = conf.get(key)
            if value is not None:
                found[name] = value
                break
    return found


#: Django's ``TASKLOCK`` setting, read by the Django adapter, which registers its reader here
#: (:func:`use_django_reader`) when it is imported. The task layer never imports an adapter: the
#: adapter plugs in, as Celery's app.conf does through the task that carries it.
_django_reader: Callable[[], dict[str, Any]] | None = None
#: What runs when project-wide settings change under a running process (Django's
#: ``override_settings``): the guards forget the options they resolved (registered by
#: :mod:`tasklock.guard`, which is above this module).
_on_settings_changed: list[Callable[[], None]] = []

#: The module that reads ``settings.TASKLOCK`` and registers itself (the Django adapter's).
DJANGO_READER_MODULE = "tasklock.django.settings"


def use_django_reader(reader: Callable[[], dict[str, Any]]) -> None:
    """Read Django's ``TASKLOCK`` setting with ``reader`` (the Django adapter calls this)."""
    global _django_reader
    _django_reader = reader


def on_settings_changed(callback: Callable[[], None]) -> None:
    """Run ``callback`` when project-wide settings change (see :func:`settings_changed`)."""
    if callback not in _on_settings_changed:
        _on_settings_changed.append(callback)


def settings_changed() -> None:
    """Project-wide settings changed (Django's ``setting_changed`` for ``TASKLOCK``): every
    task re-resolves its options on next use."""
    for callback in list(_on_settings_changed):
        callback()


def django_setting() -> dict[str, Any]:
    """Django's ``TASKLOCK`` setting as options, or {} where the process uses no Django."""
    # Only when the project already imported Django: tasklock never imports Django itself. The
    # adapter's reader is loaded by name the first time (it registers itself), so that a project
    # with TASKLOCK in its settings needs no INSTALLED_APPS entry for tasks to read it.
    if "django.conf" not in sys.modules:
        return {}
    if _django_reader is None:
        importlib.import_module(DJANGO_READER_MODULE)
    assert _django_reader is not None, f"{DJANGO_READER_MODULE} registers the Django reader"
    return _django_reader()
