"""Compute page routes."""

from django.urls import path

from fleet import namespace_views, views

app_name = "fleet"

urlpatterns = [
    path("", views.cluster_list, name="cluster_list"),
    path("clusters/<uuid:pk>/", views.cluster_detail, name="cluster_detail"),
    path("clusters/<uuid:pk>/nodes/", views.cluster_nodes, name="cluster_nodes"),
    path("clusters/<uuid:pk>/commands/", views.cluster_commands, name="cluster_commands"),
    path("clusters/<uuid:pk>/commands/form/", views.command_form, name="command_form"),
    path("clusters/<uuid:pk>/settings/", views.cluster_settings, name="cluster_settings"),
    path("clusters/<uuid:pk>/join-tokens/", views.join_token_create, name="join_token_create"),
    path("clusters/<uuid:pk>/resume-automation/", views.cluster_resume_automation, name="cluster_resume_automation"),
    path("namespaces/", namespace_views.namespace_list, name="namespace_list"),
    path("namespaces/<uuid:pk>/bind/", namespace_views.namespace_bind, name="namespace_bind"),
    path("namespaces/<uuid:pk>/delete/", namespace_views.namespace_delete, name="namespace_delete"),
    path("nodes/<uuid:pk>/", views.node_detail, name="node_detail"),
    path("nodes/<uuid:pk>/rename/", views.node_rename, name="node_rename"),
    path("nodes/<uuid:pk>/<slug:action>/", views.node_action, name="node_action"),
]
