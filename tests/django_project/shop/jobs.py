"""An RQ job under django-rq's ``@job`` with no tasklock options of its own: everything comes
from ``settings.TASKLOCK``. django-rq binds the queue of ``@job`` when this module is imported, so
``RQ_QUEUES`` must be set by then."""

from __future__ import annotations

from typing import Any

from django_rq import job
from rq import get_current_job

from tasklock.rq import singleton_job
from tests.django_project.shop.locks import held_locks


@job("default")
@singleton_job
def reserve(item_id: int) -> dict[str, Any]:
    current = get_current_job()
    assert current is not None
    current.connection.rpush("shop:reserved", item_id)
    return {"item_id": item_id, "locks": held_locks()}
