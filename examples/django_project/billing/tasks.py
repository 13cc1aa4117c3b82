"""A Celery task whose tasklock settings come from settings.TASKLOCK (URL, TTL, prefix, policy);
only what describes this task's arguments is on the decorator."""

import os
import time
from typing import Any

from tasklock.celery import singleton_task


@singleton_task(key=["invoice_id"], fencing=True)
def send_invoice(invoice_id: int, channel: str = "email", fence_token: int | None = None) -> Any:
    time.sleep(1)  # render the PDF, talk to the mail provider
    return {"invoice_id": invoice_id, "fence": fence_token, "pid": os.getpid()}
