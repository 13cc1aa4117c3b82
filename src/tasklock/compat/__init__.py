"""Drop-in replacements for celery-once and celery-singleton, on tasklock's core.

Moving is one import::

    # from celery_once import QueueOnce, AlreadyQueued
    from tasklock.compat.celery_once import AlreadyQueued, QueueOnce
    # from celery_singleton import Singleton, DuplicateTaskError, clear_locks
    from tasklock.compat.celery_singleton import DuplicateTaskError, Singleton, clear_locks

Both libraries lock at *enqueue* time, which is what tasklock's ``dedupe_enqueue`` does: the
compat tasks are :class:`tasklock.celery.SingletonTask` subclasses with ``dedupe_enqueue`` and no
execution lock (``limit=None``), whose enqueue marker has the original's key and value (so old
and new workers exclude each other during a deploy) and is kept in the original's backend. What
tasklock adds: every marker has a TTL, it is cleared only by its owner, and it is cleared on
success, final failure, revoke, a hard time limit, a killed child and a failed publish; a retry
is never refused as its own duplicate. The migration pages in ``docs/`` list every option and
every deliberate difference.

The package is an adapter on top of :mod:`tasklock.celery` (the ``layers`` contract): nothing
below it imports it, and it shares the Celery adapter's task class instead of copying its rules.
"""

__all__: list[str] = []
