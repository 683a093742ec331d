"""Ray page routes."""

from django.urls import path

from raymgr import views
from raymgr.workloads import views as wviews

app_name = "raymgr"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("clusters/", views.cluster_list, name="cluster_list"),
    path("clusters/new/", views.cluster_create, name="cluster_create"),
    path("clusters/<uuid:pk>/", views.cluster_detail, name="cluster_detail"),
    path("clusters/<uuid:pk>/start/", views.cluster_start, name="cluster_start"),
    path("clusters/<uuid:pk>/stop/", views.cluster_stop, name="cluster_stop"),
    path("clusters/<uuid:pk>/delete/", views.cluster_delete, name="cluster_delete"),
    path("cards/", wviews.dashboard_cards, name="dashboard_cards"),
    *wviews.urls_for(wviews.TRAINING),
    *wviews.urls_for(wviews.TUNE),
    path("tune/<uuid:pk>/train/", wviews.tune_train, name="tune_train"),
    *wviews.urls_for(wviews.SERVE),
]
