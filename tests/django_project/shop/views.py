"""A view that writes as a fenced task would: ``fence()`` and the update in one
``transaction.atomic()``, 409 Conflict when the token is stale.

The database is ``settings.SHOP_DATABASE`` (``"default"`` when unset): the tests point it at the
PostgreSQL they start.
"""

from __future__ import annotations

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from tasklock import StaleFence
from tasklock.django.fencing import fence
from tests.django_project.shop.models import Invoice


@require_POST
def pay_invoice(request: HttpRequest, invoice_id: int) -> JsonResponse:
    """POST ``token`` (the writer's fence token) and ``status``."""
    using = getattr(settings, "SHOP_DATABASE", DEFAULT_DB_ALIAS)
    token = int(request.POST["token"])
    status = request.POST.get("status", "paid")
    try:
        with transaction.atomic(using=using):
            fence(f"invoice:{invoice_id}", token, using=using)
            updated = (
                Invoice.objects.using(using)
                .filter(pk=invoice_id)
                .update(status=status, paid_by=token)
            )
    except StaleFence as stale:
        return JsonResponse({"error": str(stale), "newer": stale.newer}, status=409)
    if not updated:
        return JsonResponse({"error": f"no invoice {invoice_id}"}, status=404)
    return JsonResponse({"invoice": invoice_id, "status": status, "token": token})
