"""Endpoint page routes (mounted under /compute/)."""

from django.urls import path

from fleet.workloads import views

app_name = "workloads"

urlpatterns = [
    path("endpoints/", views.endpoint_list, name="endpoint_list"),
    path("clusters/<uuid:pk>/endpoints/", views.cluster_endpoints, name="cluster_endpoints"),
    path("endpoints/<uuid:pk>/<slug:action>/", views.endpoint_action, name="endpoint_action"),
]
