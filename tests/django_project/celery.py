"""The test project's Celery app, configured from Django settings (``CELERY_*``) as Celery's
Django guide shows. Not made the current app: other test modules of the same pytest run use
their own apps and must not fall back to this one."""

from __future__ import annotations

from celery import Celery

app = Celery("django_project", set_as_current=False)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
