"""The filtersets of the workload lists (containers, model locations, endpoints), on the shared
`fleet.filters` machinery: the API's `?node=`, `?cluster=`, `?status=`, `?model_id=`."""

from __future__ import annotations

from fleet.workloads.models import ContainerStatus, EndpointStatus
from kernel.filters import Filter, FilterSet, as_uuid, choice, text

CONTAINER_FILTERS = FilterSet(
    node=Filter("node_id", as_uuid),
    cluster=Filter("cluster_id", as_uuid),
    status=Filter("status", choice(ContainerStatus.values)),
)
MODEL_LOCATION_FILTERS = FilterSet(
    model_id=Filter("model_id", text(200)),  # as long as a model id may be (fleet.workloads.services.MAX_MODEL_ID)
    node=Filter("node_id", as_uuid),
    cluster=Filter("node__cluster_id", as_uuid),
)
ENDPOINT_FILTERS = FilterSet(
    node=Filter("node_id", as_uuid),
    cluster=Filter("cluster_id", as_uuid),
    status=Filter("status", choice(EndpointStatus.values)),
)
