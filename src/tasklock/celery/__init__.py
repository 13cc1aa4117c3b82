"""tasklock for Celery: one-at-a-time tasks, HA ``celery beat``.

::

    from tasklock.celery import singleton_task

    @singleton_task(key=["account_id"])            # or base=SingletonTask on @app.task
    def settle(account_id): ...

    celery -A proj beat -S tasklock.celery.LeaderScheduler

The package, one job per module: :mod:`~tasklock.celery.task` (the task base and the decorator,
the call's flow through the guard), :mod:`~tasklock.celery.options` (settings, task options and
the broker's Redis), :mod:`~tasklock.celery.outcomes` (what a skipped or failed call records),
:mod:`~tasklock.celery.rates` (a rate-limited call re-sent for its slot) and
:mod:`~tasklock.celery.beat` (the HA beat scheduler).
"""

from tasklock.celery.beat import LeaderScheduler
from tasklock.celery.task import DUPLICATE, RATE_LIMITED, SingletonTask, singleton_task

__all__ = ["DUPLICATE", "RATE_LIMITED", "LeaderScheduler", "SingletonTask", "singleton_task"]
