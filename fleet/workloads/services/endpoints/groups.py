"""A distributed endpoint's group: its checks before anything starts, and the start of all its ranks as one unit.

The group runs vLLM split into `pipeline_parallel` stages, one per Ray node of the managed Ray cluster the
endpoint names (`fleet.workloads.groups`: the head's fleet node is the leader, rank 0, serving the API; each
worker's a follower), `tensor_parallel` GPUs within each node. Every rank is an `EndpointReplica` with its
`group_rank`; each gets an `endpoint.start` carrying its `EndpointGroup` (backend `mp`: vLLM's own multi-node
executor, the one its CPU build runs; the followers join the leader at the Ray head's address and a port of
`ENDPOINT_GROUP_PORTS`). All ranks are placed and admitted against the quotas in the caller's transaction, so
either every rank starts or none does; a rank is charged only the GPUs and VRAM it holds beyond what its Ray node
already holds (and counts: `GroupMember.gpus` / `vram_mb`, kept as `EndpointReplica.covered_*`). A rank told to
stop whose stop is still on its way (its node offline) holds up a start on its own node only: placed elsewhere, a
fresh rank (its own replica and server id) starts there and the old one is left to its stop, which stays queued
and ends its server when its node comes back (`rank_left_behind`). Called inside the callers' transactions, the
endpoint's row locked.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db.models import Sum
from django.utils import timezone

from agent import protocol
from fleet.models import COMMAND_OPEN_STATUSES, Command
from fleet.workloads.groups import GroupMember, GroupPlan, group_source
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services.endpoints.placement import pick_endpoint_node
from fleet.workloads.services.endpoints.replicas import replica_queue_start

MAX_PARALLEL = int(protocol.rules.field_rules(protocol.EndpointGroup)["pipeline_parallel"].max or 0)


def validate_parallel(value: Any, field: str) -> int:
    """`pipeline_parallel` / `tensor_parallel`: an integer from 1 to the protocol's bound."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARALLEL:
        raise ValidationError({field: f"Must be an integer between 1 and {MAX_PARALLEL}."})
    return value


def validate_distributed(*, node: Any, replicas: tuple[int, int], autoscaled: bool, pipeline_parallel: int) -> None:
    """What an endpoint on a Ray cluster may not ask with it: a node (its Ray nodes are its nodes), several
    replicas or autoscaling (it runs one group), fewer than two pipeline stages. ValidationError on the field."""
    if node is not None:
        raise ValidationError({"node": "An endpoint on a Ray cluster runs on the cluster's nodes: leave node out."})
    if replicas != (1, 1):
        raise ValidationError({"min_replicas": "An endpoint on a Ray cluster runs one group: min and max replicas 1."})
    if autoscaled:
        raise ValidationError({"target_requests_per_min": "An endpoint on a Ray cluster is not autoscaled."})
    if pipeline_parallel < 2:
        raise ValidationError(
            {"pipeline_parallel": "An endpoint on a Ray cluster spans its nodes: at least 2 pipeline stages."}
        )


def group_plan(*, endpoint: Endpoint) -> GroupPlan:
    """The Ray cluster's members the endpoint's group runs on now, checked against what it asks: one pipeline
    stage per Ray node (head and workers), `tensor_parallel` GPUs on each (1 on nodes without GPUs, where a
    rank is one vLLM CPU process). ValidationError on the field at fault."""
    if endpoint.ray_cluster_id is None:
        raise ValidationError({"ray_cluster": "The endpoint's Ray cluster was deleted: its group cannot start."})
    plan = group_source().plan(ray_cluster_id=endpoint.ray_cluster_id, workspace_id=endpoint.cluster.workspace_id)
    if len(plan.members) < 2:
        raise ValidationError({"ray_cluster": "A distributed endpoint spans two Ray nodes or more: add a worker."})
    if endpoint.pipeline_parallel != len(plan.members):
        raise ValidationError(
            {
                "pipeline_parallel": f"Must equal the Ray cluster's nodes (one pipeline stage per node): it has "
                f"{len(plan.members)} running (the head and {len(plan.members) - 1} worker(s))."
            }
        )
    for member in plan.members:
        if member.node.cluster_id != endpoint.cluster_id:
            raise ValidationError({"ray_cluster": f"Its {member.label} runs outside this compute cluster."})
        if member.node.gpu_count == 0 and endpoint.tensor_parallel > 1:
            raise ValidationError(
                {"tensor_parallel": f"Node {member.node.name} ({member.label}) has no GPU: tensor_parallel must be 1."}
            )
        if member.node.gpu_count and member.node.gpu_count < endpoint.tensor_parallel:
            raise ValidationError(
                {
                    "tensor_parallel": f"Node {member.node.name} ({member.label}) has {member.node.gpu_count} "
                    f"GPU(s), fewer than tensor_parallel {endpoint.tensor_parallel}."
                }
            )
    return plan


def rank_settled(rank: EndpointReplica) -> bool:
    """Not live, and no stop of its server still on its way (a hung server told to stop stays failed while its
    stop runs): a new start under its id before that would find the old server still there."""
    stop = rank.stop_command
    return rank.status not in EndpointStatus.live() and (stop is None or stop.status not in COMMAND_OPEN_STATUSES)


def rank_left_behind(rank: EndpointReplica, member: GroupMember) -> bool:
    """`rank` was told to stop, its stop is still on its way (queued while its node is offline), and the group
    now places that rank on another node: it need not wait there. A fresh rank starts on the new node under its
    own server id, and the old one is left to its stop (a rank placed on its own node again waits for it)."""
    told = rank.status in (EndpointStatus.STOPPING, EndpointStatus.FAILED) and rank.stop_command_id is not None
    return told and not rank_settled(rank) and rank.node_id != member.node.pk


def current_ranks(endpoint: Endpoint) -> dict[int, EndpointReplica]:
    """The group's ranks by number: the replica of each now (one left behind stopping elsewhere is not)."""
    rows = endpoint.replicas.select_related("stop_command").filter(group_rank__isnull=False, replacements__isnull=True)
    return {r.group_rank: r for r in rows}


def _covered(member: GroupMember, replica: EndpointReplica) -> tuple[int, int]:
    """(GPUs, VRAM MB) of its Ray node's holding the rank may run on uncharged: what the Ray node holds, less
    what the other live ranks on it (other groups') already run on."""
    taken = (
        EndpointReplica.objects.filter(ray_node=member.ray_node, status__in=EndpointStatus.live())
        .exclude(pk=replica.pk)
        .aggregate(gpus=Sum("covered_gpus", default=0), vram=Sum("covered_vram_mb", default=0))
    )
    return max(member.gpus - taken["gpus"], 0), max(member.vram_mb - taken["vram"], 0)


def ranks_charge_released() -> int:
    """Charge in full, from now on, every live rank whose Ray node no longer holds what it covered (that Ray
    node failed, stopped or is gone, so `raymgr.quotas` no longer counts it): a rank left behind on an offline
    node keeps its GPUs until its stop reaches it, and they must count somewhere. Returns the ranks changed
    (the healing beat runs this every pass)."""
    covered = EndpointReplica.objects.filter(status__in=EndpointStatus.live()).exclude(ray_node="")
    covered = covered.exclude(covered_gpus=0, covered_vram_mb=0)
    rows = list(covered.values_list("pk", "ray_node"))
    if not rows:
        return 0
    held = group_source().held(ray_nodes=sorted({ray_node for _, ray_node in rows}))
    released = [pk for pk, ray_node in rows if ray_node not in held]
    return covered.filter(pk__in=released).update(covered_gpus=0, covered_vram_mb=0, updated_at=timezone.now())


def _master_port(endpoint: Endpoint, leader_node_id: Any) -> int:
    """The first port of `ENDPOINT_GROUP_PORTS` no other live group led from that node holds, nor this group's
    last run."""
    held = set(
        Endpoint.objects.filter(
            replicas__group_rank=0,
            replicas__node_id=leader_node_id,
            replicas__status__in=EndpointStatus.live(),
        )
        .exclude(pk=endpoint.pk)
        .values_list("master_port", flat=True)
    )
    held.add(endpoint.master_port)  # a restart: not the port the last run's ranks may still hold
    low, high = settings.ENDPOINT_GROUP_PORTS
    port = next((p for p in range(low, high + 1) if p not in held), None)
    if port is None:
        raise ValidationError({"ray_cluster": f"Every port of {low}-{high} is held by a group led from that node."})
    return port


def group_start(*, actor: AbstractBaseUser | None, endpoint: Endpoint) -> list[Command]:
    """Place every rank on its Ray node's fleet node and queue its `endpoint.start` (the leader's first); the
    checks of `group_plan`, then per node the model's weights, GPUs, VRAM and CPU cores as for one replica
    (`pick_endpoint_node`: PlacementError naming the node). Nothing is kept when one refuses (the caller's
    transaction): each rank asks only what it holds beyond its Ray node's holding (`_covered`). A rank still
    stopping on another node than its new one is left to its stop and replaced by a fresh rank
    (`rank_left_behind`); one still live otherwise refuses the start. Clears the group's last failure."""
    plan = group_plan(endpoint=endpoint)
    ranks = current_ranks(endpoint)
    behind = set()
    for old in ranks.values():
        member = plan.members[old.group_rank] if old.group_rank < len(plan.members) else None
        if member is not None and rank_left_behind(old, member):
            behind.add(old.group_rank)
        elif old.status in EndpointStatus.live():
            raise ValidationError({"ray_cluster": f"Rank {old.group_rank} is still {old.status}: stop it first."})
    endpoint.master_port = _master_port(endpoint, plan.members[0].node.pk)
    endpoint.group_failure_code = endpoint.group_failure = ""
    # GPUs per rank: tensor_parallel on GPU nodes (each rank pins them), none on CPU nodes
    endpoint.gpus = endpoint.tensor_parallel if plan.members[0].node.gpu_count else 0
    endpoint.save(update_fields=["master_port", "group_failure_code", "group_failure", "gpus", "updated_at"])
    commands = []
    for rank, member in enumerate(plan.members):
        node = pick_endpoint_node(
            cluster=endpoint.cluster,
            model_id=endpoint.model_id,
            revision=endpoint.revision,
            gpus=endpoint.gpus,
            min_vram_mb=endpoint.min_vram_mb,
            node=member.node,
        )
        replica = ranks.get(rank)
        if replica is None or rank in behind:  # a fresh server id: the old rank's late outcomes stay its own
            fresh = EndpointReplica._meta.get_field("server_id").get_default
            server_id = endpoint.slug if replica is None and rank == 0 else fresh()
            replica = EndpointReplica.objects.create(
                endpoint=endpoint, server_id=server_id, group_rank=rank, replacement_of=replica
            )
        replica.ray_node = member.ray_node
        replica.covered_gpus, replica.covered_vram_mb = _covered(member, replica)
        replica.save(update_fields=["ray_node", "covered_gpus", "covered_vram_mb", "updated_at"])
        group = protocol.EndpointGroup(
            pipeline_parallel=endpoint.pipeline_parallel,
            tensor_parallel=endpoint.tensor_parallel,
            nnodes=len(plan.members),
            node_rank=rank,
            master_addr=plan.master_addr,
            master_port=endpoint.master_port,
            role="leader" if rank == 0 else "follower",
            backend="mp",
            container=member.container,  # its Ray node's container where that carries vLLM (the group source)
        )
        commands.append(replica_queue_start(actor=actor, endpoint=endpoint, replica=replica, node=node, group=group))
    return commands
