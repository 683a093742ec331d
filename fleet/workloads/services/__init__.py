"""Writes for workloads, one module per aggregate: `containers`, `node_models` (models cached on nodes),
`endpoints` (inference endpoints and their placement); `common` holds what they share.

Called by the receivers of the fleet core's signals (`fleet.workloads.receivers`): inventory
reconciliation, and the command-finished hook `workloads_on_command_finished`, so every finished command
updates the rows it concerns. Callers import from here; every public name is re-exported below.
"""

from __future__ import annotations

from fleet.workloads.services.api_keys import api_key_create, api_key_revoke
from fleet.workloads.services.common import MAX_MODEL_ID, MAX_REVISION, node_event_record_failure, system_actor
from fleet.workloads.services.containers import (
    REF_OUTCOME,
    container_record_create_failed,
    container_record_created,
    container_record_ref_outcome,
    containers_reconcile,
    containers_record_queued,
    containers_record_start_queued,
)
from fleet.workloads.services.endpoint_autoscale import (
    ScaleDecision,
    desired_replicas,
    endpoint_autoscale,
    endpoints_to_autoscale,
)
from fleet.workloads.services.endpoint_heal import endpoint_heal, endpoints_to_heal
from fleet.workloads.services.endpoint_idle import endpoint_idle, endpoint_wake, endpoints_to_idle
from fleet.workloads.services.endpoint_locking import endpoints_lock_for_commands
from fleet.workloads.services.endpoint_updates import endpoint_update
from fleet.workloads.services.endpoints import (
    MAX_IDLE_TIMEOUT_S,
    MAX_REPLICAS,
    MAX_SERVER_ARG_LENGTH,
    MAX_SERVER_ARGS,
    MAX_TARGET_IN_FLIGHT,
    MAX_TARGET_TOKENS_PER_S,
    REVISION_RE,
    PlacementError,
    endpoint_create,
    endpoint_record_acked,
    endpoint_record_command_outcome,
    endpoint_record_start_commands,
    endpoint_restart,
    endpoint_stop,
    endpoints_end_with_node,
    endpoints_reconcile,
    node_free_vram_mb,
    validate_model_id,
    validate_server_args,
)
from fleet.workloads.services.node_models import (
    node_model_record_download_failed,
    node_model_record_downloaded,
    node_models_reconcile,
)

__all__ = [
    "MAX_IDLE_TIMEOUT_S",
    "MAX_MODEL_ID",
    "MAX_REPLICAS",
    "MAX_REVISION",
    "MAX_SERVER_ARGS",
    "MAX_SERVER_ARG_LENGTH",
    "MAX_TARGET_IN_FLIGHT",
    "MAX_TARGET_TOKENS_PER_S",
    "REF_OUTCOME",
    "REVISION_RE",
    "PlacementError",
    "ScaleDecision",
    "api_key_create",
    "api_key_revoke",
    "container_record_create_failed",
    "container_record_created",
    "container_record_ref_outcome",
    "containers_reconcile",
    "containers_record_queued",
    "containers_record_start_queued",
    "desired_replicas",
    "endpoint_autoscale",
    "endpoint_create",
    "endpoint_heal",
    "endpoint_idle",
    "endpoint_record_acked",
    "endpoint_record_command_outcome",
    "endpoint_record_start_commands",
    "endpoint_restart",
    "endpoint_stop",
    "endpoint_update",
    "endpoint_wake",
    "endpoints_end_with_node",
    "endpoints_lock_for_commands",
    "endpoints_reconcile",
    "endpoints_to_autoscale",
    "endpoints_to_heal",
    "endpoints_to_idle",
    "node_event_record_failure",
    "node_free_vram_mb",
    "node_model_record_download_failed",
    "node_model_record_downloaded",
    "node_models_reconcile",
    "system_actor",
    "validate_model_id",
    "validate_server_args",
]
