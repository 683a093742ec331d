"""Compute page routes."""

from django.urls import path

from fleet import views

app_name = "fleet"

urlpatterns = [
    path("", views.cluster_list, name="cluster_list"),
]
