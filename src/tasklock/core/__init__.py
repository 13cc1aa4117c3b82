"""The framework-free lock core: imports nothing from Celery, RQ or Django."""
