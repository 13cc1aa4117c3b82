"""The test project's one model: an invoice that fenced writers pay.

``fence`` is the fence column for ``fenced_update`` (the default field name) and ``ship_fence`` a
second one for ``field=``; ``paid_by`` records the token of the write that set ``status``. The app
has no migrations: the tests create the table with ``migrate --run-syncdb``.
"""

from __future__ import annotations

from django.db import models


class Invoice(models.Model):
    status = models.CharField(max_length=20, default="open")
    paid_by = models.BigIntegerField(null=True)
    fence = models.BigIntegerField(null=True)
    ship_fence = models.BigIntegerField(null=True)

    def __str__(self) -> str:
        return f"invoice {self.pk} ({self.status})"
