"""Writes for the compute fleet, one module per aggregate. Keyword-only, one transaction each, side effects
on commit.

- `clusters`: compute clusters; `namespaces`: namespaces of a workspace.
- `registration`: join tokens and node registration.
- `nodes`: the node state machine, one service per transition (`node_cordon`, `node_drain`, ...), each a
  conditional UPDATE from the states it accepts, so concurrent changes cannot both win.
- `presence`: what the tunnel consumer reports (connected, disconnected, heartbeats), the lost-nodes pass
  and the partition pause.
- `commands`: the command status machine (every change goes through `command_transition`, which refuses
  illegal moves and ignores exact duplicates) and queueing; `command_delivery`: claiming and sending;
  `command_records`: what agents report back.
- `events`: the node event log's writer; `common`: helpers the modules above share.

Callers import from here (`from fleet import services`); every public service is re-exported below.
"""

from __future__ import annotations

from fleet.services.clusters import ARGOCD_FIELDS, CLUSTER_FIELDS, cluster_create, cluster_delete, cluster_update
from fleet.services.command_delivery import (
    command_batch_claim_and_send,
    command_claim_and_send,
    command_pending_for_node,
    command_record_delivered,
    commands_resend_stuck,
)
from fleet.services.command_records import (
    CommandReport,
    command_record_ack,
    command_record_error,
    command_record_progress,
    command_record_reports,
    command_record_result,
)
from fleet.services.commands import (
    COMMAND_MOVES,
    COMMAND_TIMESTAMP,
    SCHEDULING_COMMANDS,
    command_dispatch,
    command_queue,
    command_transition,
)
from fleet.services.events import node_event_record
from fleet.services.namespaces import namespace_bind, namespace_create, namespace_delete
from fleet.services.nodes import (
    node_cordon,
    node_delete,
    node_drain,
    node_finish_drain,
    node_purge,
    node_rename,
    node_uncordon,
)
from fleet.services.presence import (
    OFFLINE_PASS_BATCH_S,
    cluster_resume_automation,
    node_agent_refused,
    node_connected,
    node_disconnected,
    node_record_heartbeat,
    node_record_heartbeats,
    node_record_inventory,
    nodes_mark_lost_offline,
)
from fleet.services.registration import (
    JOIN_TOKEN_PREFIX,
    JOIN_TOKEN_TTL,
    hash_join_token,
    join_command,
    join_token_create,
    join_tokens_expire,
    node_register,
)
from kernel.exceptions import IllegalTransition

__all__ = [
    "ARGOCD_FIELDS",
    "CLUSTER_FIELDS",
    "COMMAND_MOVES",
    "COMMAND_TIMESTAMP",
    "JOIN_TOKEN_PREFIX",
    "JOIN_TOKEN_TTL",
    "OFFLINE_PASS_BATCH_S",
    "SCHEDULING_COMMANDS",
    "CommandReport",
    "IllegalTransition",
    "cluster_create",
    "cluster_delete",
    "cluster_resume_automation",
    "cluster_update",
    "command_batch_claim_and_send",
    "command_claim_and_send",
    "command_dispatch",
    "command_pending_for_node",
    "command_queue",
    "command_record_ack",
    "command_record_delivered",
    "command_record_error",
    "command_record_progress",
    "command_record_reports",
    "command_record_result",
    "command_transition",
    "commands_resend_stuck",
    "hash_join_token",
    "join_command",
    "join_token_create",
    "join_tokens_expire",
    "namespace_bind",
    "namespace_create",
    "namespace_delete",
    "node_agent_refused",
    "node_connected",
    "node_cordon",
    "node_delete",
    "node_disconnected",
    "node_drain",
    "node_event_record",
    "node_finish_drain",
    "node_purge",
    "node_record_heartbeat",
    "node_record_heartbeats",
    "node_record_inventory",
    "node_register",
    "node_rename",
    "node_uncordon",
    "nodes_mark_lost_offline",
]
