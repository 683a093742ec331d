"""Ray fixtures: compute clusters with real registered nodes, and feeding command results back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agent import protocol
from fleet import services as fleet_services
from fleet.models import Command, ComputeCluster, Node
from fleet.signals import command_finished
from raymgr import services
from raymgr.models import RayCluster
from tests.fleet.conftest import facts_dict, make_csr_pem, make_key

GPU = [{"index": 0, "name": "NVIDIA H100", "uuid": "GPU-1", "memory_total_mb": 80000, "memory_used_mb": 0}]


@pytest.fixture
def compute(owner, workspace) -> ComputeCluster:
    return fleet_services.cluster_create(actor=owner, workspace=workspace, name="prod")


@pytest.fixture
def add_node(db) -> Callable[..., Node]:
    """Factory: a node registered via join token + CSR, online, with `memory_mb` RAM of which `used_mb` in use."""

    def make(
        cluster: ComputeCluster,
        hostname: str,
        *,
        gpus: int = 0,
        memory_mb: int = 64000,
        used_mb: int = 1000,
        online: bool = True,
    ) -> Node:
        owner = cluster.workspace.memberships.filter(role="owner").first().user
        _, raw = fleet_services.join_token_create(cluster=cluster, actor=owner)
        facts = facts_dict(hostname, memory_total_mb=memory_mb, gpus=GPU * gpus)
        node, _ = fleet_services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts)
        if online:
            fleet_services.node_connected(
                node=node,
                facts=protocol.from_dict(protocol.HostFacts, facts, where="facts"),
                inventory=protocol.Inventory(),
            )
            fleet_services.node_record_heartbeat(
                node_id=node.pk,
                heartbeat=protocol.Heartbeat(
                    cpu_percent=5, memory_percent=100 * used_mb / memory_mb, memory_used_mb=used_mb
                ),
            )
        node.refresh_from_db()
        return node

    return make


def finish(
    command: Command,
    *,
    ok: bool = True,
    data: dict[str, Any] | None = None,
    code: str = "internal",
    message: str = "it broke",
) -> Command | None:
    """Record a command's outcome the way the tunnel consumer does (fleet services), then the signal.

    Until fleet services send `command_finished` themselves (the lead wires it at merge) the signal is
    sent here; once they do, it is not sent twice.
    """
    fired: list[Any] = []

    def spy(sender: Any, command: Command, **kwargs: Any) -> None:
        fired.append(command.pk)

    command_finished.connect(spy, weak=False, dispatch_uid="test-spy")
    try:
        if ok:
            done = fleet_services.command_record_result(node=command.node, command_id=command.pk, data=data or {})
        else:
            done = fleet_services.command_record_error(
                node=command.node, command_id=command.pk, code=code, message=message
            )
    finally:
        command_finished.disconnect(dispatch_uid="test-spy")
    if done is not None and not fired:
        command_finished.send(sender=Command, command=done)
    return done


def last_command(command_type: str, **payload: Any) -> Command:
    """The newest command of `command_type` whose payload contains `payload`."""
    rows = Command.objects.filter(command_type=command_type)
    for key, value in payload.items():
        rows = rows.filter(**{f"payload__{key}": value})
    return rows.select_related("node").order_by("-created_at").first()


@pytest.fixture
def make_ray(owner, workspace, compute) -> Callable[..., RayCluster]:
    def make(name: str = "train", **kwargs: Any) -> RayCluster:
        kwargs.setdefault("gcs_port", 6380)
        return services.ray_cluster_create(
            actor=owner, workspace=workspace, compute_cluster=compute, name=name, **kwargs
        )

    return make


def start_head(cluster: RayCluster, *, ip: str = "10.0.0.1") -> Command:
    """Answer the cluster's pending head start with success."""
    command = last_command("ray.head.start", cluster_id=str(cluster.pk))
    finish(command, data={"container_id": "c-head", "ray_node_id": "aa" * 28, "ip": ip})
    cluster.refresh_from_db()
    return command


def confirm_submissions() -> None:
    """Answer every in-flight `ray.job.submit` as the head would (accepted, PENDING).

    The control plane polls a job's status only once its submission is confirmed.
    """
    for command in Command.objects.filter(
        command_type="ray.job.submit", status__in=["queued", "dispatched", "running"]
    ):
        finish(command, data={"submission_id": command.payload.get("submission_id", ""), "status": "PENDING"})
