"""Writes for workloads, one module per aggregate: `containers`, `node_models` (models cached on nodes),
`endpoints` (inference endpoints: a package, one job per module), `catalog` (the model catalog); `common` holds
what they share.

Called by the receivers of the fleet core's signals (`fleet.workloads.receivers`): inventory
reconciliation, and the command-finished hook `workloads_on_command_finished`, so every finished command
updates the rows it concerns. Callers import from here; every public name is re-exported below.
"""

from __future__ import annotations

from fleet.workloads.services import endpoints
from fleet.workloads.services.api_keys import api_key_create, api_key_revoke
from fleet.workloads.services.catalog import catalog_import, catalog_private_create, catalog_private_delete
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
from fleet.workloads.services.endpoints import *  # noqa: F403  (the endpoint aggregate's names: `endpoints.__all__`)
from fleet.workloads.services.node_models import (
    node_cache_set_budget,
    node_model_evict,
    node_model_record_download_failed,
    node_model_record_downloaded,
    node_model_record_evicted,
    node_models_reconcile,
    node_models_record_queued,
)

__all__ = [
    "MAX_MODEL_ID",
    "MAX_REVISION",
    "REF_OUTCOME",
    "api_key_create",
    "api_key_revoke",
    "catalog_import",
    "catalog_private_create",
    "catalog_private_delete",
    "container_record_create_failed",
    "container_record_created",
    "container_record_ref_outcome",
    "containers_reconcile",
    "containers_record_queued",
    "containers_record_start_queued",
    "node_cache_set_budget",
    "node_event_record_failure",
    "node_model_evict",
    "node_model_record_download_failed",
    "node_model_record_downloaded",
    "node_model_record_evicted",
    "node_models_reconcile",
    "node_models_record_queued",
    "system_actor",
    *endpoints.__all__,
]
