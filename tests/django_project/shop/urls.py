"""The test project's URLs, for ``override_settings(ROOT_URLCONF=...)`` with this module."""

from __future__ import annotations

from django.urls import path

from tests.django_project.shop import views

urlpatterns = [
    path("invoices/<int:invoice_id>/pay", views.pay_invoice, name="pay-invoice"),
]
