"""Audit page routes."""

from django.urls import path

from audit import views

app_name = "audit"

urlpatterns = [path("", views.entry_list, name="entry_list")]
