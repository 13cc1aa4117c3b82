"""The least Django project that lets autodoc import tasklock.django.models and .admin."""

SECRET_KEY = "docs-build-only"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.admin",
    "tasklock.django",
]
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
