"""The demo's RQ jobs, enqueued by dotted path (``tasklock.demo.rq_jobs.settle``).

tasklock finds Redis through ``TASKLOCK_URL`` and namespaces its keys with
``TASKLOCK_KEY_PREFIX``, both set by the demo for its workers.
"""

from __future__ import annotations

from typing import Any

from tasklock.demo import ledger
from tasklock.rq import singleton_job

__all__ = ["export", "rebuild_report", "refresh", "settle"]


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
