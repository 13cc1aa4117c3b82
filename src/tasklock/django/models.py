"""The fence table as a Django model, so that ``manage.py migrate`` creates it.

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

__all__ = ["Fence"]


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
