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
    path("training/", wviews.training_list, name="training_list"),
    path("training/new/", wviews.training_create, name="training_create"),
    path("training/<uuid:pk>/", wviews.training_detail, name="training_detail"),
    path("training/<uuid:pk>/cancel/", wviews.training_cancel, name="training_cancel"),
    path("tune/", wviews.tune_list, name="tune_list"),
    path("tune/new/", wviews.tune_create, name="tune_create"),
    path("tune/<uuid:pk>/", wviews.tune_detail, name="tune_detail"),
    path("tune/<uuid:pk>/cancel/", wviews.tune_cancel, name="tune_cancel"),
    path("tune/<uuid:pk>/train/", wviews.tune_train, name="tune_train"),
    path("serving/", wviews.serve_list, name="serve_list"),
    path("serving/new/", wviews.serve_create, name="serve_create"),
    path("serving/<uuid:pk>/", wviews.serve_detail, name="serve_detail"),
    path("serving/<uuid:pk>/stop/", wviews.serve_stop, name="serve_stop"),
]
