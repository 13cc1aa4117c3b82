"""The test project's app: a Celery task and an RQ job configured only from TASKLOCK."""
