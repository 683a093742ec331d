"""API routes for tenancy."""

from rest_framework.routers import DefaultRouter

from tenancy.api.views import WorkspaceViewSet

router = DefaultRouter()
router.include_root_view = False  # the API root (cleverthis.urls) lists every resource
router.register("workspaces", WorkspaceViewSet, basename="workspace")

urlpatterns = router.urls
