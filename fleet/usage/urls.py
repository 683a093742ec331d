"""Usage page routes (mounted under /usage/ by the root URL map)."""

from django.urls import path

from fleet.usage import views

app_name = "usage"

urlpatterns = [
    path("", views.usage_page, name="usage"),
    path("export.csv", views.usage_csv, name="usage_csv"),
    path("chargeback/", views.chargeback_page, name="chargeback"),
    path("chargeback.csv", views.chargeback_csv, name="chargeback_csv"),
]
