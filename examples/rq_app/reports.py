"""An RQ job that rebuilds a customer's report: slow, and requested again and again.

Run workers in this directory with ``rq worker reports`` (``--url redis://...`` for another Redis).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tasklock.rq import singleton_job

REPORTS_DIR = Path(os.environ.get("REPORTS_DIR", "reports"))


# key=["customer_id"]: one rebuild per customer at a time, whoever asked.
# dedupe_enqueue=True: rebuild_report.enqueue(queue, ...) returns the job that is already queued
# or running for this customer instead of queueing another one.
# fencing=True: the job gets fence_token (also stored in job.meta["tasklock"]).
# No Redis URL: tasklock locks on the Redis of the queue the job came from.
@singleton_job(key=["customer_id"], dedupe_enqueue=True, fencing=True)
def rebuild_report(customer_id: int, requested_by: str = "", fence_token: int | None = None) -> str:
    time.sleep(1)  # the expensive queries
    REPORTS_DIR.mkdir(exist_ok=True)
    report = REPORTS_DIR / f"customer-{customer_id}.txt"
    report.write_text(f"customer {customer_id}: built with fence token {fence_token}\n")
    return str(report)
