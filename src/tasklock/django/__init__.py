"""Django integration: one ``TASKLOCK`` setting, validated by system checks.

Set-up, in the project's settings module::

    INSTALLED_APPS += ["tasklock.django"]

    TASKLOCK = {
        "URL": "redis://localhost:6379/0",   # or "URLS": [three or five masters] for Redlock,
                                             # or "etcd://etcd1:2379,etcd2:2379,etcd3:2379"
        "TTL": 30,                           # seconds; the watchdog renews it while a task runs
        "ON_DUPLICATE": "skip",              # "skip" | "raise" | "retry" | "wait"
        "KEY_PREFIX": "myproject",
    }

The keys are the task options in upper case (``URL``, ``URLS``, ``TTL``, ``KEY_PREFIX``,
``ON_DUPLICATE``, ``ON_BACKEND_ERROR``, ``WAIT_TIMEOUT``, ``ON_WAIT_TIMEOUT``,
``DEDUPE_ENQUEUE``, ``LIMIT``, ``RATE``, ``BURST``, ``RATE_GROUP``, ``ON_RATE_LIMIT``,
``PENDING_TTL``, ``WATCHDOG``). ``KEY``, ``FENCING`` and ``RATE_KEY`` describe one task's
arguments, so they belong on the task decorator, not here.

When Django is configured, the Celery and RQ adapters read ``TASKLOCK`` whether or not the app is
installed (precedence: task options > ``TASKLOCK`` > Celery ``app.conf`` > environment >
defaults). Installing the app adds what a Django project expects on top:

* system checks (``manage.py check``): every wrong setting is its own ``tasklock.E0xx`` error with
  a hint, and risky but legal settings are ``tasklock.W0xx`` warnings;
* ``override_settings(TASKLOCK=...)`` in tests takes effect at once: tasks re-read the setting;
* fencing where the data lives (:mod:`tasklock.django.fencing`): ``fence(resource, token)``
  inside ``transaction.atomic()`` checks a task's fence token in the database, in the writer's
  transaction, and raises :class:`tasklock.StaleFence` (rolling the block back) when a newer
  token has written already; ``fenced_update(queryset, token, **values)`` does the same with a
  fence column on the row itself. The app's model and migration create the fence table
  (``manage.py migrate``); ``manage.py tasklock_prune_fences --older-than SECONDS`` prunes it;
* with ``django.contrib.admin``, a **Held locks** admin page (:mod:`tasklock.django.admin`):
  who holds what (Redis or etcd), a force-release that deletes only the value shown, and the
  fleet counts per task; staff only, permissions ``tasklock.view_locks`` and
  ``tasklock.release_locks``.

System checks do not run under ``celery worker`` or ``rq worker``, so the same validation runs
when a task first reads the setting and raises ``ImproperlyConfigured`` there.

This package imports Django; ``import tasklock`` never imports it.
"""
