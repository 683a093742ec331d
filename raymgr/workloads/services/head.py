"""Talking to a Ray cluster's head: workload commands (`ray.job.*`, `ray.serve.status`) sent to its node."""

from __future__ import annotations

from typing import Any

from agent import protocol
from fleet.models import Command, CommandStatus
from kernel.exceptions import IllegalTransition
from raymgr.models import RayCluster, RayClusterStatus, RayNode
from raymgr.services import dispatch, running_head
from raymgr.workloads import render

IN_FLIGHT = (CommandStatus.QUEUED, CommandStatus.DISPATCHED, CommandStatus.RUNNING)
WORKLOAD_COMMANDS = frozenset(protocol.RAY_JOB_COMMAND_TYPES)


def cluster_head(cluster: RayCluster) -> RayNode | None:
    """The running head of a running cluster, or None."""
    if cluster.status != RayClusterStatus.RUNNING:
        return None
    return running_head(cluster)


def _payload(cluster: RayCluster, head: RayNode, command_type: str, **extra: Any) -> Any:
    """The `command_type` payload (its protocol dataclass) for the head's node, with `extra` fields."""
    cls = protocol.PAYLOAD_TYPES[command_type]
    return cls(
        cluster_id=str(cluster.pk),
        member_id=str(head.pk),
        runtime=cluster.runtime,
        dashboard_port=cluster.dashboard_port,
        host=cluster.head_service_host,  # kuberay: the head's Service (else the head's own node)
        **extra,
    )


def send_to_head(actor: Any, cluster: RayCluster, command_type: str, **extra: Any) -> Command | None:
    """Dispatch one workload command to the head's node; None when there is no running head."""
    head = cluster_head(cluster)
    if head is None or actor is None:
        return None
    try:
        return dispatch(
            actor, head.node, command_type, _payload(cluster, head, command_type, **extra), as_workload=True
        )
    except IllegalTransition:
        return None


def in_flight(command_type: str, submission_id: str) -> bool:
    """Whether a `command_type` command about `submission_id` is still on its way."""
    return Command.objects.filter(
        command_type=command_type, payload__submission_id=submission_id, status__in=IN_FLIGHT
    ).exists()


def submit_job(actor: Any, cluster: RayCluster, submission: render.Submission) -> Command | None:
    """Send `ray.job.submit` for `submission` to the head; None when there is no running head."""
    return send_to_head(
        actor,
        cluster,
        "ray.job.submit",
        submission_id=submission.submission_id,
        entrypoint=submission.entrypoint,
        files=submission.files,
        runtime_env=submission.runtime_env,
        entrypoint_num_cpus=submission.entrypoint_num_cpus,
        entrypoint_num_gpus=submission.entrypoint_num_gpus,
    )
