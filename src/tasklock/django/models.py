"""The fence table as a Django model, so that ``manage.py migrate`` creates it; and
:class:`HeldLock`, a model without a table that gives the admin page of held locks its permissions.

One row per fenced resource: the newest token that wrote it. :func:`tasklock.django.fencing.fence`
writes it (one statement, from :mod:`tasklock.fencing.rules`, the same SQL as the SQLAlchemy form),
and ``manage.py tasklock_prune_fences`` deletes rows nobody can still be fenced against. Read it
like any model (``Fence.objects.get(pk="invoice:42").token``); do not write it by hand: a token
lowered by hand lets a stale holder through.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models

from tasklock.fencing.rules import DEFAULT_TABLE, MAX_RESOURCE

__all__ = ["Fence", "HeldLock"]


class Fence(models.Model):
    """The newest fence token that wrote ``resource`` (table ``tasklock_fence``)."""

    resource: models.CharField[str, str] = models.CharField(
        max_length=MAX_RESOURCE, primary_key=True
    )
    token: models.BigIntegerField[int, int] = models.BigIntegerField()
    updated_at: models.DateTimeField[datetime, datetime] = models.DateTimeField()

    class Meta:
        db_table = DEFAULT_TABLE
        verbose_name = "fence"

    def __str__(self) -> str:
        return f"{self.resource} @ {self.token}"


class HeldLock(models.Model):
    """No table: the admin page of held locks (:mod:`tasklock.django.admin`) hangs off it.

    Django's admin lists pages per model and checks permissions per model, and the locks live in
    Redis (or etcd), not in the database. An unmanaged model gives the page a place in the admin
    index and two permissions of its own, created by ``migrate`` like any model's:
    ``tasklock.view_locks`` (see the page) and ``tasklock.release_locks`` (force-release a lock).
    Its default add/change/delete/view permissions are turned off, since they would mean nothing.
    """

    # Explicit, so that the model state does not follow the project's DEFAULT_AUTO_FIELD.
    id: models.AutoField[int, int] = models.AutoField(primary_key=True)

    class Meta:
        managed = False
        db_table = "tasklock_heldlock_no_table"
        default_permissions = ()
        permissions = [
            ("view_locks", "Can see held tasklock locks and the fleet's counts"),
            ("release_locks", "Can force-release a held tasklock lock"),
        ]
        verbose_name = "held lock"
        verbose_name_plural = "held locks"

    def __str__(self) -> str:
        return f"held lock {self.pk}"
