"""tasklock for RQ: one-at-a-time jobs.

::

    from tasklock.rq import singleton_job

    @singleton_job(key=["account_id"])
    def settle(account_id): ...

The package, one job per module: :mod:`~tasklock.rq.job` (the decorator and the job's flow
through the guard), :mod:`~tasklock.rq.functions` (what ``@singleton_job`` accepts) and
:mod:`~tasklock.rq.dependents` (dependents of a skipped twin).
"""

from tasklock.rq.job import (
    ENQUEUE_GRACE,
    META_KEY,
    SingletonJob,
    SingletonJobFunction,
    singleton_job,
)

__all__ = ["ENQUEUE_GRACE", "META_KEY", "SingletonJob", "SingletonJobFunction", "singleton_job"]
