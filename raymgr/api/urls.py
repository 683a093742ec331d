"""API routes for managed Ray, mounted at /api/v1/ray/."""

from rest_framework.routers import SimpleRouter

from raymgr.api.views import RayClusterViewSet

router = SimpleRouter()
router.register("clusters", RayClusterViewSet, basename="ray-cluster")

urlpatterns = router.urls
