"""Ray page routes."""

from django.urls import path

from raymgr import views

app_name = "raymgr"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
]
