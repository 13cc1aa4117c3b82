"""Settings of the test project.

The Redis URL is a per-run test server, so the Redis-dependent settings are built by
:func:`redis_settings` and applied by the tests with ``override_settings`` (a real project writes
the same dict inline). Keeping ``TASKLOCK`` out of the base settings also means that, once the
test module is done, ``TASKLOCK`` is absent again for the rest of the pytest process.
"""

from __future__ import annotations

from typing import Any

SECRET_KEY = "tasklock-tests-only"
DEBUG = False
USE_TZ = True
# The admin and what it needs, for tasklock's admin page of held locks (test_django_admin*.py).
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_rq",
    "tasklock.django",
    "tests.django_project.shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ROOT_URLCONF = "tests.django_project.urls"
STATIC_URL = "/static/"
# The test client's host, and the live server's for the browser test.
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
RQ_QUEUES: dict[str, Any] = {}


CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True


def redis_settings(url: str) -> dict[str, Any]:
    """The project's Redis settings for one test server (``redis://host:port/0``).

    Queues (django-rq, Celery) use database 0 and the locks database 1, as a project might keep
    them apart: the tests can then tell that the locks follow ``TASKLOCK["URL"]`` and not the
    queue's or the broker's Redis, which the adapters fall back to when no URL is set.
    """
    locks = url.rsplit("/", 1)[0] + "/1"
    return {
        "TASKLOCK": {
            "URL": locks,
            "TTL": 20,
            "KEY_PREFIX": "shop",
            "ON_DUPLICATE": "skip",
        },
        "RQ_QUEUES": {"default": {"URL": url}},
        "CELERY_BROKER_URL": url,
        "CELERY_RESULT_BACKEND": url,
    }
