"""Settle each account's pending payments with one transfer, however often settling is requested.

Run a worker with ``celery -A payments worker --concurrency 4``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import ledger
from celery import Celery

from tasklock.celery import singleton_task

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
DB = os.environ.get("PAYMENTS_DB", "payments.sqlite3")

# tasklock needs no URL of its own here: it locks on the broker's Redis.
app = Celery("payments", broker=REDIS_URL, backend=REDIS_URL)


# key=["account_id"]: one settle per account at a time, whoever asked (requested_by is not part
# of the key). Duplicates are skipped (on_duplicate="skip", the default).
# fencing=True: the body gets fence_token, which the ledger's fence checks before it moves money
# (tasklock.StaleFence, and nothing moves, if a newer holder has written for the account).
@singleton_task(app=app, key=["account_id"], fencing=True)
def settle(
    account_id: int, requested_by: str = "", fence_token: int | None = None
) -> dict[str, Any]:
    payments = ledger.pending(DB, account_id)  # read ...
    if not payments:
        return {"account_id": account_id, "cents": 0, "fence": fence_token}
    time.sleep(1)  # ... risk checks, FX rates: the slow part between the read and the write ...
    ids = [payment_id for payment_id, _ in payments]
    assert fence_token is not None  # always passed by tasklock with fencing=True
    cents = ledger.transfer(DB, account_id, ids, fence_token)  # ... and the fenced write
    return {"account_id": account_id, "cents": cents, "fence": fence_token}
