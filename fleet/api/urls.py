"""API v1 routes of the fleet (trailing slash optional)."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from fleet.api import views

router = DefaultRouter()
router.trailing_slash = "/?"  # accept /clusters and /clusters/ alike
router.include_root_view = False
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("commands", views.CommandViewSet, basename="command")
router.register("namespaces", views.NamespaceViewSet, basename="namespace")

urlpatterns = [
    path("agent/register", views.AgentRegisterView.as_view(), name="agent-register"),
    path("agent/register/", views.AgentRegisterAlias.as_view()),
    *router.urls,
]
