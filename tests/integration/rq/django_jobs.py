"""Singleton jobs stacked with django-rq's ``@job``, in both orders (needs Django settings with
``RQ_QUEUES``: see django_scenario.py, which configures them before importing this module)."""

from __future__ import annotations

from typing import Any

from django_rq import job

from tasklock.rq import singleton_job
from tests.integration.rq.jobs import connection, lock_held


@job
@singleton_job(key=["name"])
def dj_outside(name: str) -> dict[str, Any]:
    connection().rpush("ran:dj_outside", name)
    return {"name": name, "held": lock_held(dj_outside, name)}


@singleton_job(key=["name"], dedupe_enqueue=True)
@job("default")
def dj_inside(name: str) -> dict[str, Any]:
    connection().rpush("ran:dj_inside", name)
    return {"name": name, "held": lock_held(dj_inside, name)}
