"""Agent updates: which nodes run the agent version this control plane serves, and `agent.update` commands.

An update is one `agent.update` command carrying the served package's version, SHA-256 and the CA's
signature over both (`fleet.agent_packages`); the agent installs it beside its running version, restarts
into it and rolls back unless it connects in time. Operators (Owner/Admin) update one node or a whole
cluster; a cluster with `auto_update_agents` gets its nodes updated as they connect. The outcome lands in
the node's event log (`record_outcome`, a `command_finished` receiver).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction

from agent import protocol
from audit.services import on, operator_action
from fleet import agent_packages, enqueue
from fleet.models import Command, CommandStatus, CommandType, ComputeCluster, Node, NodeEvent
from kernel.exceptions import IllegalTransition
from tenancy.mixins import require_operator

UPDATABLE_FROM_PROTOCOL = 2  # agents before protocol 2 cannot update themselves: re-run the install script
UNFINISHED = (CommandStatus.QUEUED, CommandStatus.DISPATCHED, CommandStatus.RUNNING)


def is_current(node: Node) -> bool:
    """True when the node's agent is the version this control plane serves."""
    return bool(node.agent_version) and node.agent_version == agent_packages.served_version()


def _refusal(node: Node) -> str:
    """Why `node` cannot be sent an update now ("" when it can)."""
    if 0 < node.protocol_version < UPDATABLE_FROM_PROTOCOL:
        return (
            f"The agent on {node.name} is too old to update itself (protocol {node.protocol_version}): "
            "re-run the install script on the node."
        )
    if Command.objects.filter(node=node, command_type=CommandType.AGENT_UPDATE, status__in=UNFINISHED).exists():
        return f"An agent update of {node.name} is already under way."
    return ""


def _queue_update(node: Node, actor: AbstractBaseUser | None, why: str) -> Command:
    package = agent_packages.served_package()
    payload = protocol.to_dict(
        protocol.AgentUpdatePayload(
            version=package.version,
            sha256=package.sha256,
            signature_b64=agent_packages.package_signature(package),
            path="/agent/package.tar.gz",
            rollback_after_s=settings.AGENT_UPDATE_ROLLBACK_S,
        )
    )
    protocol.parse_payload(CommandType.AGENT_UPDATE, payload)  # its rules, as the agent checks them
    command = Command.objects.create(
        node=node,
        cluster_id=node.cluster_id,
        command_type=CommandType.AGENT_UPDATE,
        payload=payload,
        idempotency_key=uuid.uuid4().hex,
        created_by=actor,
    )
    NodeEvent.objects.create(
        node=node,
        kind="agent.update",
        message=f"Agent update {node.agent_version or '?'} → {package.version} {why}",
        data={"from": node.agent_version, "to": package.version},
        command=command,
    )
    enqueue.dispatch_command(command.pk)
    return command


@operator_action("node.update_agent", target=on("node", "node"))
def node_update_agent(*, node: Node, actor: AbstractBaseUser) -> Command:
    """Send `node` an `agent.update` to the served version (Owner/Admin). Refused when the node already
    runs it, cannot update itself (too old) or has an update under way."""
    require_operator(actor, node.cluster.workspace)
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        if is_current(node):
            raise IllegalTransition(f"{node.name} already runs agent {node.agent_version}.")
        refusal = _refusal(node)
        if refusal:
            raise IllegalTransition(refusal)
        return _queue_update(node, actor, f"requested by {actor.get_username()}")


@operator_action("cluster.update_agents", target=on("cluster", "cluster"))
def cluster_update_agents(*, cluster: ComputeCluster, actor: AbstractBaseUser) -> list[Command]:
    """Send every node of `cluster` not on the served version an `agent.update` (those that can take one)."""
    require_operator(actor, cluster.workspace)
    with transaction.atomic():
        nodes = list(Node.objects.select_for_update().filter(cluster=cluster).order_by("pk"))
        due = [n for n in nodes if not is_current(n) and not _refusal(n)]
        if not due:
            raise IllegalTransition("Every node of this cluster runs the current agent or is already updating.")
        return [_queue_update(n, actor, f"requested by {actor.get_username()} for the cluster") for n in due]


@operator_action("cluster.auto_update_agents", target=on("cluster", "cluster"))
def cluster_set_auto_update(*, cluster: ComputeCluster, actor: AbstractBaseUser, enabled: bool) -> ComputeCluster:
    """Turn automatic agent updates of `cluster` on or off (Owner/Admin)."""
    require_operator(actor, cluster.workspace)
    ComputeCluster.objects.filter(pk=cluster.pk).update(auto_update_agents=bool(enabled))
    cluster.refresh_from_db()
    return cluster


def node_auto_update(*, node: Node) -> Command | None:
    """On connect: queue an update when the node's cluster updates automatically and it is not current."""
    with transaction.atomic():
        # The node's row only (`of=("self",)`): locking its cluster too on every hello deadlocked with
        # fan-outs, whose command inserts hold the cluster's key-share lock while they reach each node.
        found = Node.objects.select_for_update(of=("self",)).select_related("cluster").filter(pk=node.pk).first()
        if found is None:  # deleted while its tunnel said hello: the revocation closes that tunnel
            return None
        node = found
        if not node.cluster.auto_update_agents or is_current(node) or _refusal(node):
            return None
        return _queue_update(node, None, "(automatic updates are on for this cluster)")


def record_outcome(sender: Any = None, *, command: Command, **_: Any) -> None:
    """`command_finished` receiver: an `agent.update`'s outcome on the node's event log."""
    if command.command_type != CommandType.AGENT_UPDATE:
        return
    result: protocol.AgentUpdateResult | None = command.parsed_result
    if result is not None:
        if result.unchanged:
            message = f"Agent already at {result.version}: nothing to update"
        else:
            message = (
                f"Agent updated {result.previous_version} → {result.version}; "
                f"back online {result.seconds} s after the update started"
            )
        NodeEvent.objects.create(
            node_id=command.node_id, kind="agent.updated", message=message, data=command.result or {}, command=command
        )
    else:
        NodeEvent.objects.create(
            node_id=command.node_id,
            kind="agent.update_failed",
            message=f"Agent update failed: {command.error_message}",
            data={"code": command.error_code},
            command=command,
        )
