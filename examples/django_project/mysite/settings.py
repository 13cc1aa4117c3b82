"""Settings of the example project: one Redis for Celery, django-rq and tasklock."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only-not-secret"
DEBUG = True
USE_TZ = True
ALLOWED_HOSTS: list[str] = []

INSTALLED_APPS = [
    "django_rq",
    "tasklock.django",  # system checks for TASKLOCK (manage.py check)
    "billing",
]

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")

# Every tasklock option, project-wide, in upper case. Options on a task decorator win over these.
TASKLOCK = {
    "URL": REDIS_URL,
    "TTL": 30,  # seconds; renewed by the watchdog while a task runs
    "ON_DUPLICATE": "skip",
    "KEY_PREFIX": "mysite",
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL

RQ_QUEUES = {"default": {"URL": REDIS_URL}}
