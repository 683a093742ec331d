"""The endpoint aggregate, one job per module (lock order: the workspace's quota row, the endpoint's row,
then its replicas'; `locking`):

- `validation`: what an endpoint may ask for, and the API's bounds;
- `placement`: which node takes a replica (`PlacementError` when none can);
- `locking`: the lock order of passes that may start replicas;
- `lifecycle`: create, stop, restart (Owner, Admin, Member);
- `starts`: endpoint.start commands as they are queued (replica rows, quota admissions);
- `outcomes`: the rows following a replica's commands' outcomes;
- `reconcile`: the node's inventory and its deletion;
- `replicas`: one replica's start and stop commands, and the endpoint's summary of its replicas;
- `events`: the endpoint's event log;
- `adapters`: LoRA adapters of a workspace, attached to endpoints and loaded by their replicas at run time;
- `cold_starts`: a replica's start phases on the endpoint's log and in /metrics;
- `limits`: the per-key rate limits callers of the endpoint are held to;
- `admission`: the concurrency limit per replica and the wait queue's bounds;
- `groups`: a distributed endpoint's group on a managed Ray cluster, checked and started as one unit, and
  `group_health`: its failing, moving and healing as one unit (the healing pass hands groups there);
- the passes of the beat: `heal` (replace lost replicas), `autoscale` (on load), `idle` (scale to zero,
  and waking), and `updates` (rolling updates to another revision or other server arguments).

Callers import from `fleet.workloads.services`; every public name is re-exported here.
"""

from __future__ import annotations

from fleet.workloads.services.endpoints.adapters import (
    endpoint_adapter_attach,
    endpoint_adapter_detach,
    endpoint_record_adapter_outcome,
    lora_adapter_create,
    lora_adapter_delete,
)
from fleet.workloads.services.endpoints.admission import (
    ADMISSION_FIELDS,
    MAX_CONCURRENCY,
    MAX_QUEUE_DEPTH,
    MAX_QUEUE_WAIT_S,
    endpoint_set_admission,
    validate_admission,
)
from fleet.workloads.services.endpoints.autoscale import (
    ScaleDecision,
    desired_replicas,
    endpoint_autoscale,
    endpoints_to_autoscale,
)
from fleet.workloads.services.endpoints.group_health import group_heal
from fleet.workloads.services.endpoints.groups import MAX_PARALLEL, group_plan, group_start, ranks_charge_released
from fleet.workloads.services.endpoints.heal import endpoint_heal, endpoints_to_heal
from fleet.workloads.services.endpoints.idle import endpoint_idle, endpoint_wake, endpoints_to_idle
from fleet.workloads.services.endpoints.lifecycle import endpoint_create, endpoint_restart, endpoint_stop
from fleet.workloads.services.endpoints.limits import MAX_PER_MINUTE, endpoint_set_key_limits, validate_per_minute
from fleet.workloads.services.endpoints.locking import endpoints_lock_for_commands
from fleet.workloads.services.endpoints.outcomes import endpoint_record_acked, endpoint_record_command_outcome
from fleet.workloads.services.endpoints.placement import PlacementError, node_free_vram_mb
from fleet.workloads.services.endpoints.reconcile import endpoints_end_with_node, endpoints_reconcile
from fleet.workloads.services.endpoints.starts import endpoint_record_start_commands
from fleet.workloads.services.endpoints.updates import endpoint_set_routing, endpoint_update
from fleet.workloads.services.endpoints.validation import (
    MAX_GPUS,
    MAX_IDLE_TIMEOUT_S,
    MAX_REPLICAS,
    MAX_SCALE_COOLDOWN_S,
    MAX_SERVER_ARG_LENGTH,
    MAX_SERVER_ARGS,
    MAX_TARGET_IN_FLIGHT,
    MAX_TARGET_REQUESTS_PER_MIN,
    MAX_TARGET_TOKENS_PER_S,
    MAX_VRAM_MB,
    REVISION_RE,
    validate_model_id,
    validate_revision,
    validate_server_args,
)

__all__ = [
    "ADMISSION_FIELDS",
    "MAX_CONCURRENCY",
    "MAX_GPUS",
    "MAX_IDLE_TIMEOUT_S",
    "MAX_PARALLEL",
    "MAX_PER_MINUTE",
    "MAX_QUEUE_DEPTH",
    "MAX_QUEUE_WAIT_S",
    "MAX_REPLICAS",
    "MAX_SCALE_COOLDOWN_S",
    "MAX_SERVER_ARGS",
    "MAX_SERVER_ARG_LENGTH",
    "MAX_TARGET_IN_FLIGHT",
    "MAX_TARGET_REQUESTS_PER_MIN",
    "MAX_TARGET_TOKENS_PER_S",
    "MAX_VRAM_MB",
    "REVISION_RE",
    "PlacementError",
    "ScaleDecision",
    "desired_replicas",
    "endpoint_adapter_attach",
    "endpoint_adapter_detach",
    "endpoint_autoscale",
    "endpoint_create",
    "endpoint_heal",
    "endpoint_idle",
    "endpoint_record_acked",
    "endpoint_record_adapter_outcome",
    "endpoint_record_command_outcome",
    "endpoint_record_start_commands",
    "endpoint_restart",
    "endpoint_set_admission",
    "endpoint_set_key_limits",
    "endpoint_set_routing",
    "endpoint_stop",
    "endpoint_update",
    "endpoint_wake",
    "endpoints_end_with_node",
    "endpoints_lock_for_commands",
    "endpoints_reconcile",
    "endpoints_to_autoscale",
    "endpoints_to_heal",
    "endpoints_to_idle",
    "group_heal",
    "group_plan",
    "group_start",
    "lora_adapter_create",
    "lora_adapter_delete",
    "node_free_vram_mb",
    "ranks_charge_released",
    "validate_admission",
    "validate_model_id",
    "validate_per_minute",
    "validate_revision",
    "validate_server_args",
]
