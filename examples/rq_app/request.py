"""Ask for report rebuilds the way a busy UI does, then show what the workers did.

Run it with ``python request.py`` while three workers run (``rq worker reports``, three times).
"""

from __future__ import annotations

import os
import time

from redis import Redis
from reports import rebuild_report
from rq import Queue
from rq.job import Job, JobStatus

redis = Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
queue = Queue("reports", connection=redis)


def wait(jobs: list[Job], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(job.get_status() in (JobStatus.FINISHED, JobStatus.FAILED) for job in jobs):
        if time.monotonic() > deadline:
            raise SystemExit("timed out: are workers running? rq worker reports")
        time.sleep(0.1)


def main() -> None:
    # Five clicks on "rebuild" for customers 7 and 8: one job each (dedupe_enqueue).
    clicks = {
        customer: [
            rebuild_report.enqueue(queue, customer, requested_by=f"click-{n}") for n in range(5)
        ]
        for customer in (7, 8)
    }
    for customer, jobs in clicks.items():
        print(
            f"customer {customer}: 5 clicks -> {len({job.id for job in jobs})} job ({jobs[0].id})"
        )

    # A producer that bypasses rebuild_report.enqueue (a plain queue.enqueue) still cannot run two
    # rebuilds of one customer at once: the worker skips it and records why in job.meta.
    bypass = queue.enqueue(rebuild_report, 7, requested_by="cron")

    jobs = [clicks[7][0], clicks[8][0], bypass]
    wait(jobs)
    for job in jobs:
        job.refresh()
        meta = job.meta["tasklock"]
        if meta["outcome"] == "ran":
            print(f"job {job.id}: ran with fence {meta['fence']} -> {job.return_value()}")
        else:
            holder = meta["duplicate"]["holder"]
            print(f"job {job.id}: {meta['outcome']}, the lock was held by {holder}")


if __name__ == "__main__":
    main()
