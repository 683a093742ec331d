"""API routes for tenancy."""

from rest_framework.routers import DefaultRouter

from cleverthis.tenancy.api.views import WorkspaceViewSet

router = DefaultRouter()
router.register("workspaces", WorkspaceViewSet, basename="workspace")

urlpatterns = router.urls
