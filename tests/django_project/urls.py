"""The test project's URLs: Django's admin (where tasklock's page of held locks lives) and the
shop's views."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("tests.django_project.shop.urls")),
]
