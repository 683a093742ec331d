"""Endpoint, model catalog, model cache and API key page routes (mounted under /compute/)."""

from django.urls import path

from fleet.workloads import benchmark_views, catalog_views, key_views, views

app_name = "workloads"

urlpatterns = [
    path("endpoints/", views.endpoint_list, name="endpoint_list"),
    path("clusters/<uuid:pk>/endpoints/", views.cluster_endpoints, name="cluster_endpoints"),
    path("endpoints/<uuid:pk>/", views.endpoint_detail, name="endpoint_detail"),
    path("clusters/<uuid:pk>/endpoints/new/", views.cluster_endpoint_create, name="cluster_endpoint_create"),
    path("endpoints/<uuid:pk>/update/", views.endpoint_update, name="endpoint_update"),
    path("endpoints/<uuid:pk>/limits/", views.endpoint_limits, name="endpoint_limits"),
    path("endpoints/<uuid:pk>/admission/", views.endpoint_admission, name="endpoint_admission"),
    path("endpoints/<uuid:pk>/routing/", views.endpoint_routing, name="endpoint_routing"),
    path("endpoints/<uuid:pk>/benchmarks/", benchmark_views.endpoint_benchmarks, name="endpoint_benchmarks"),
    path(
        "endpoints/<uuid:pk>/benchmarks/new/", benchmark_views.endpoint_benchmark_start, name="endpoint_benchmark_start"
    ),
    path("endpoints/<uuid:pk>/benchmarks/compare/", benchmark_views.benchmark_compare, name="benchmark_compare"),
    path("endpoints/<uuid:pk>/benchmarks/<uuid:benchmark>/", benchmark_views.benchmark_detail, name="benchmark_detail"),
    path(
        "endpoints/<uuid:pk>/benchmarks/<uuid:benchmark>/export.<slug:kind>",
        benchmark_views.benchmark_export,
        name="benchmark_export",
    ),
    path("endpoints/<uuid:pk>/<slug:action>/", views.endpoint_action, name="endpoint_action"),
    path("models/", catalog_views.catalog_page, name="catalog"),
    path("models/new/", catalog_views.catalog_private_create, name="catalog_private_create"),
    path("models/<uuid:pk>/delete/", catalog_views.catalog_private_delete, name="catalog_private_delete"),
    path("model-caches/<uuid:pk>/", catalog_views.node_cache, name="node_cache"),  # pk: the node's
    path("model-caches/<uuid:pk>/budget/", catalog_views.node_cache_budget, name="node_cache_budget"),
    path("model-caches/evict/<uuid:pk>/", catalog_views.node_cache_evict, name="node_cache_evict"),  # a NodeModel
    path("api-keys/", key_views.api_key_list, name="api_key_list"),
    path("api-keys/<int:pk>/revoke/", key_views.api_key_revoke, name="api_key_revoke"),
]
