"""``python manage.py billing_demo``: duplicate work for the Celery task and the RQ job."""

import time
from typing import Any

from billing.jobs import export_ledger
from billing.tasks import send_invoice
from django.core.management.base import BaseCommand
from rq.job import JobStatus

from tasklock.celery import DUPLICATE

DONE = ("SUCCESS", "FAILURE", DUPLICATE)


class Command(BaseCommand):
    help = "Send duplicate work to Celery and RQ and show what tasklock made of it."

    def handle(self, *args: Any, **options: Any) -> None:
        resolved = send_invoice.tasklock_guard.options
        sources = ", ".join(
            f"{name}={getattr(resolved, name)!r} ({resolved.sources[name]})"
            for name in ("url", "ttl", "key_prefix", "on_duplicate", "fencing")
        )
        self.stdout.write(f"send_invoice options: {sources}")

        # Celery: five sends for one invoice at once. One runs; the rest are skipped.
        results = [send_invoice.delay(1001, channel=f"retry-{n}") for n in range(5)]
        # RQ via django-rq: five .delay() calls while one is pending return the same job.
        jobs = [export_ledger.delay("2026-11") for _ in range(5)]

        deadline = time.monotonic() + 30
        while any(r.state not in DONE for r in results) or any(
            job.get_status() not in (JobStatus.FINISHED, JobStatus.FAILED) for job in jobs
        ):
            if time.monotonic() > deadline:
                raise SystemExit("timed out: are the Celery and RQ workers running?")
            time.sleep(0.1)

        ran = [r.result for r in results if r.state == "SUCCESS"]
        skipped = [r for r in results if r.state == DUPLICATE]
        fences = ", ".join(str(done["fence"]) for done in ran)
        self.stdout.write(
            f"send_invoice(1001) x5: {len(ran)} ran (fence {fences}), {len(skipped)} skipped "
            f"({DUPLICATE})"
        )
        ids = {job.id for job in jobs}
        self.stdout.write(
            f"export_ledger.delay('2026-11') x5: {len(ids)} job -> {jobs[0].return_value()}"
        )
