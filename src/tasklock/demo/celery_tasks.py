"""The demo's Celery app: ``celery -A tasklock.demo.celery_tasks worker`` runs it.

Broker, result backend and tasklock all use ``TASKLOCK_URL``; queue and key names carry the run's
``TASKLOCK_KEY_PREFIX`` so that a demo against a shared Redis stays in its own namespace.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from celery import Celery, Task

from tasklock.celery import singleton_task
from tasklock.demo import ledger

__all__ = ["app", "celery_url", "export", "notify", "rebuild_report", "refresh", "settle"]


def celery_url(url: str) -> str:
    """``url`` as Celery and kombu spell it: a unix socket is ``redis+socket:///path``."""
    parts = urlsplit(url)
    if parts.scheme != "unix":
        return url
    db = parse_qs(parts.query).get("db", ["0"])[0]
    return f"redis+socket://{parts.netloc}{parts.path}?virtual_host={db}"


_url = celery_url(os.environ.get("TASKLOCK_URL", "redis://127.0.0.1:6379/0"))
_namespace = ledger.namespace()

app = Celery("tasklock_demo", broker=_url, backend=_url)
app.conf.update(
    task_default_queue=_namespace,
    broker_transport_options={"global_keyprefix": f"{_namespace}:celery:"},
    result_backend_transport_options={"global_keyprefix": f"{_namespace}:celery:"},
    control_exchange=f"{_namespace}-control",
    result_expires=600,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)


# One settlement per account at a time; the body gets a fence token to guard its write.
@singleton_task(app=app, name="demo.settle", fencing=True)
def settle(account_id: int, fence_token: int | None = None) -> dict[str, Any]:
    return ledger.work("celery", "settle", account_id, fence_token, ledger.SETTLE_SECONDS)


# dedupe_enqueue: asking again while one is queued or running returns that task's AsyncResult.
@singleton_task(app=app, name="demo.rebuild_report", fencing=True, dedupe_enqueue=True)
def rebuild_report(report_id: int, fence_token: int | None = None) -> dict[str, Any]:
    return ledger.work("celery", "rebuild_report", report_id, fence_token, ledger.REBUILD_SECONDS)


# limit=2: at most two exports of one tenant at once; the others wait for a free slot.
@singleton_task(app=app, name="demo.export", limit=2, on_duplicate="wait", wait_timeout=60)
def export(tenant_id: int) -> dict[str, Any]:
    return ledger.work(
        "celery", "export", tenant_id, None, ledger.EXPORT_SECONDS, fenced_write=False
    )


# dedupe_enqueue="until_start": one running + one queued. A submission while it runs is queued
# once (the rest get that task's AsyncResult) and runs after it, so it sees the change.
@singleton_task(
    app=app, name="demo.refresh", fencing=True, dedupe_enqueue="until_start",
    on_duplicate="wait", wait_timeout=None,
)  # fmt: skip
def refresh(report_id: int, fence_token: int | None = None) -> dict[str, Any]:
    return ledger.work("celery", "refresh", report_id, fence_token, ledger.REFRESH_SECONDS)


# rate="5/s" per tenant (the call key), no execution lock. A call over the rate reserves its slot
# and is re-sent to arrive at it (on_rate_limit="retry"): no worker process waits meanwhile.
@singleton_task(
    app=app, name="demo.notify", bind=True, limit=None, rate=f"{ledger.NOTIFY_PER_SECOND}/s"
)
def notify(self: Task[Any, Any], tenant_id: int) -> dict[str, Any]:
    # A re-sent call carries an eta: the slot it reserved. The first run of a call has none.
    eta = self.request.eta
    if isinstance(eta, str):
        eta = datetime.fromisoformat(eta)
    slot = eta.timestamp() if isinstance(eta, datetime) else None
    extra = {"call": self.request.id, "resent": slot is not None, "slot": slot}
    return ledger.work(
        "celery", "notify", tenant_id, None, ledger.NOTIFY_SECONDS, fenced_write=False, extra=extra
    )
