"""URLconf for workload API tests: the workload router under /api/v1/ as the lead will mount it."""

from django.urls import include, path

from fleet.workloads.api import router

urlpatterns = [path("api/v1/", include(router.urls))]
