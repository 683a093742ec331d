"""Root URL map: pages, admin, API v1 and its schema."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from cleverthis.metrics_scrape import metrics_view
from cleverthis.tenancy import views as tenancy_views
from fleet import agent_views
from fleet.workloads.api import router as workload_router

api_v1 = [
    path("", include("cleverthis.tenancy.api.urls")),
    path("", include("fleet.api.urls")),
    path("", include(workload_router.urls)),
    path("ray/", include("raymgr.api.urls")),
]

urlpatterns = [
    path("", tenancy_views.dashboard, name="dashboard"),
    path("healthz", tenancy_views.healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("accounts/login/", tenancy_views.SignInView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("agent/install.sh", agent_views.install_script, name="agent-install-script"),
    path("agent/package.tar.gz", agent_views.agent_package, name="agent-package"),
    path("admin/login/", tenancy_views.admin_sign_in),  # before admin.site.urls: sign-in is rate limited
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("compute/", include("fleet.urls")),
    path("ray/", include("raymgr.urls")),
]
