"""Root URL map: pages, admin, API v1 (its root lists every top-level resource) and its schema."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularSwaggerView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import APIRootView

from audit.api import router as audit_router
from cleverthis import health
from cleverthis.metrics_scrape import metrics_view
from cleverthis.overview import dashboard
from fleet import agent_views
from fleet.usage.api import BudgetsView, PriceVersionsView, UsageView
from fleet.workloads.api import router as workload_router
from kernel.api import api_not_found
from kernel.schema_view import CachedSchemaView
from tenancy import views as tenancy_views

# Every top-level resource of /api/v1/, by the URL name of its list.
API_ROOT = {
    "workspaces": "workspace-list",
    "clusters": "cluster-list",
    "nodes": "node-list",
    "commands": "command-list",
    "namespaces": "namespace-list",
    "containers": "container-list",
    "models": "model-location-list",
    "catalog": "catalog-model-list",
    "model-caches": "model-cache-list",
    "endpoints": "endpoint-list",
    "ray-clusters": "ray-cluster-list",
    "training-jobs": "ray-training-job-list",
    "tune-experiments": "ray-tune-experiment-list",
    "deployments": "ray-deployment-list",
    "audit": "audit-entry-list",
    "api-keys": "api-key-list",
    "usage": "usage-report",
    "prices": "price-versions",
    "budgets": "budgets",
}


@extend_schema(exclude=True)
class ApiRootView(APIRootView):
    """CleverThis Compute Fleet API v1: every top-level resource. Schema at /api/schema/, docs at /api/docs/."""

    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        response = super().get(request, *args, **kwargs)
        # routes with an optional trailing slash reverse without it: show every list the same way
        response.data = {name: url if url.endswith("/") else f"{url}/" for name, url in response.data.items()}
        return response


api_v1 = [
    path("", ApiRootView.as_view(api_root_dict=API_ROOT), name="api-root"),
    path("", include("tenancy.api.urls")),
    path("", include("fleet.api.urls")),
    path("", include(workload_router.urls)),
    path("ray/", include("raymgr.api.urls")),
    path("", include(audit_router.urls)),
    re_path(r"^usage/?$", UsageView.as_view(), name="usage-report"),
    re_path(r"^prices/?$", PriceVersionsView.as_view(), name="price-versions"),
    re_path(r"^budgets/?$", BudgetsView.as_view(), name="budgets"),
]

urlpatterns = [
    path("", dashboard, name="dashboard"),
    path("healthz", health.healthz, name="healthz"),
    path("dispatch-banner", health.dispatch_banner, name="dispatch-banner"),
    path("metrics", metrics_view, name="metrics"),
    path("workspaces/<uuid:pk>/quotas/", tenancy_views.workspace_quotas, name="workspace-quota-page"),
    path("accounts/login/", tenancy_views.SignInView.as_view(), name="login"),
    path("accounts/logout/", tenancy_views.SignOutView.as_view(), name="logout"),
    path("accounts/oidc/authenticate/", tenancy_views.SsoStartView.as_view(), name="oidc_authentication_init"),
    path("accounts/oidc/callback/", tenancy_views.SsoCallbackView.as_view(), name="oidc_authentication_callback"),
    path("accounts/oidc/no-workspace/", tenancy_views.sso_no_workspace, name="sso-no-workspace"),
    path("agent/install.sh", agent_views.install_script, name="agent-install-script"),
    path("agent/package.tar.gz", agent_views.agent_package, name="agent-package"),
    path("admin/login/", tenancy_views.admin_sign_in),  # before admin.site.urls: sign-in is rate limited
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("api/schema/", CachedSchemaView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("compute/", include("fleet.urls")),
    path("compute/", include("fleet.workloads.urls")),
    path("ray/", include("raymgr.urls")),
    path("audit/", include("audit.urls")),
    path("usage/", include("fleet.usage.urls")),
    re_path(r"^api/(?P<unmatched>.*)$", api_not_found),  # last: unknown API URLs answer JSON 404s
]

# A refused request gets the product's page with the reason and a link back (CSRF: settings.CSRF_FAILURE_VIEW).
handler403 = "cleverthis.errors.permission_denied"
