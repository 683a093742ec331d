"""API routes for managed Ray, mounted at /api/v1/ray/."""

from rest_framework.routers import SimpleRouter

from raymgr.api.views import RayClusterViewSet
from raymgr.workloads.api import ServeDeploymentViewSet, TrainingJobViewSet, TuneExperimentViewSet

router = SimpleRouter()
router.register("clusters", RayClusterViewSet, basename="ray-cluster")
router.register("training-jobs", TrainingJobViewSet, basename="ray-training-job")
router.register("tune-experiments", TuneExperimentViewSet, basename="ray-tune-experiment")
router.register("deployments", ServeDeploymentViewSet, basename="ray-deployment")

urlpatterns = router.urls
