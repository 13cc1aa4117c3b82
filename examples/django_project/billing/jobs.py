"""An RQ job under django-rq's @job; tasklock reads settings.TASKLOCK for it too."""

import time

from django_rq import job

from tasklock.rq import singleton_job


# @singleton_job goes outside django-rq's @job, so that .delay() deduplicates as well.
@singleton_job(dedupe_enqueue=True)
@job("default")
def export_ledger(month: str) -> str:
    time.sleep(1)  # the big query
    return f"ledger-{month}.csv"
