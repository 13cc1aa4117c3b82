# Load the Celery app with Django, so that @singleton_task uses it (Celery's usual Django set-up).
from .celery import app as celery_app

__all__ = ["celery_app"]
