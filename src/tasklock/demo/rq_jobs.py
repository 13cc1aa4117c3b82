"""The demo's RQ jobs, enqueued by dotted path (``tasklock.demo.rq_jobs.settle``).

tasklock finds Redis through ``TASKLOCK_URL`` and namespaces its keys with
``TASKLOCK_KEY_PREFIX``, both set by the demo for its workers.
"""

from __future__ import annotations

from typing import Any

from rq import get_current_job

from tasklock.demo import ledger
from tasklock.rq import META_KEY, singleton_job

__all__ = ["export", "notify", "rebuild_report", "refresh", "settle"]


@singleton_job(fencing=True)
def settle(account_id: int, fence_token: int | None = None) -> dict[str, Any]:
    return ledger.work("rq", "settle", account_id, fence_token, ledger.SETTLE_SECONDS)


@singleton_job(fencing=True, dedupe_enqueue=True)
def rebuild_report(report_id: int, fence_token: int | None = None) -> dict[str, Any]:
    return ledger.work("rq", "rebuild_report", report_id, fence_token, ledger.REBUILD_SECONDS)


@singleton_job(limit=2, on_duplicate="wait", wait_timeout=60)
def export(tenant_id: int) -> dict[str, Any]:
    return ledger.work("rq", "export", tenant_id, None, ledger.EXPORT_SECONDS, fenced_write=False)


@singleton_job(fencing=True, dedupe_enqueue="until_start", on_duplicate="wait", wait_timeout=None)
def refresh(report_id: int, fence_token: int | None = None) -> dict[str, Any]:
    return ledger.work("rq", "refresh", report_id, fence_token, ledger.REFRESH_SECONDS)


# rate="5/s" per tenant, no execution lock. A job whose slot is near sleeps for it in the horse;
# further away it is rescheduled for it (on_rate_limit="retry"), which takes RQ's scheduler.
@singleton_job(limit=None, rate=f"{ledger.NOTIFY_PER_SECOND}/s")
def notify(tenant_id: int) -> dict[str, Any]:
    job = get_current_job()
    # A rescheduled job's tasklock record says when it was sent back (retry_in).
    record = job.meta.get(META_KEY, {}) if job is not None else {}
    extra = {"call": job.id if job is not None else None, "resent": "retry_in" in record}
    return ledger.work(
        "rq", "notify", tenant_id, None, ledger.NOTIFY_SECONDS, fenced_write=False, extra=extra
    )
