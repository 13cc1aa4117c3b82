"""A small Django project for the tests: settings, and a "shop" app with a Celery task and an RQ
job that take every tasklock option from ``settings.TASKLOCK``.

:func:`setup` configures Django once per process with ``settings.configure`` rather than
``DJANGO_SETTINGS_MODULE``: the environment variable would leak into worker subprocesses started
by other test modules (Celery's Django fix-up acts on it), and the core tests must not change
behaviour because this module ran first.
"""

from __future__ import annotations

import importlib

import django
import django.conf

__all__ = ["setup"]


def setup() -> None:
    """Configure Django with this project's settings (idempotent)."""
    # Not `from django.conf import settings`: importing this package's own `settings` submodule
    # would rebind that name in this module.
    settings = django.conf.settings
    project_settings = importlib.import_module("tests.django_project.settings")
    if not settings.configured:
        values = {name: getattr(project_settings, name) for name in dir(project_settings)}
        settings.configure(**{name: value for name, value in values.items() if name.isupper()})
    elif "tests.django_project.shop" not in settings.INSTALLED_APPS:
        raise RuntimeError(
            "Django was already configured in this pytest process with other settings; the "
            "Django tests need tests.django_project.settings"
        )
    django.setup()
    _migrate_default()


_migrated = False


def _migrate_default() -> None:
    """Migrate the in-memory ``default`` database, once per process.

    The admin's users, sessions and permissions live there. It must exist before any other
    alias is migrated, too: django-rq's permission migration reads content types through the
    default database whatever alias it runs on.
    """
    global _migrated
    if not _migrated:
        from django.core.management import call_command

        call_command("migrate", run_syncdb=True, verbosity=0)
        _migrated = True
