"""Control plane + agent handler with real Ray processes, without the tunnel.

Each command the services dispatch is executed by `agent.ray.commands.RayCommandHandler` (process runtime)
with the payload exactly as the agent receives it (`Command.wire_payload()`), and its outcome recorded
through fleet's `command_record_result` / `command_record_error`, as the tunnel consumer does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import CommandFailed
from agent.ray.commands import RayCommandHandler
from agent.ray.ports import free_port
from agent.ray.process_runtime import RayProcessRuntime
from agent.runner import result_data
from fleet.models import Command, CommandStatus
from raymgr import services
from raymgr.models import RayNode, RayNodeStatus
from tests.raymgr.conftest import finish
from tests.support.processes import VENV_BIN, wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RayCommandHandler]:
    runtime = RayProcessRuntime(VENV_BIN / "ray", tmp_path / "ray")
    yield RayCommandHandler(process_runtime=runtime, default_num_cpus=1)
    runtime.stop_all()


def run_queued(agent: RayCommandHandler) -> list[Command]:
    """Execute every queued ray.* command, oldest first, and record each outcome."""
    done = []
    for command in Command.objects.filter(status=CommandStatus.QUEUED).select_related("node").order_by("created_at"):
        try:
            data = agent.run(command.command_type, command.wire_payload(), lambda *a, **k: None)
        except CommandFailed as exc:
            finish(command, ok=False, code=exc.code, message=exc.message)
        else:
            finish(command, data=result_data(command.command_type, data))  # as the agent sends it
        done.append(command)
    return done


@pytest.mark.timeout(300)
def test_cluster_lifecycle_with_real_ray(agent, compute, add_node, make_ray, owner):
    add_node(compute, "only-box", memory_mb=16000)
    cluster = make_ray(
        runtime="process",
        gcs_port=free_port(),
        dashboard_port=free_port(),
        min_workers=1,
        max_workers=1,
        idle_timeout_s=1,
    )
    run_queued(agent)  # head start
    cluster.refresh_from_db()
    assert cluster.status == "running", cluster.failure_reason
    assert cluster.head_ip
    run_queued(agent)  # the min_workers worker
    worker = RayNode.objects.get(ray_cluster=cluster, role="worker")
    assert worker.status == RayNodeStatus.RUNNING
    assert worker.ray_node_id

    # Beat pass → ray.status on the head → stored: both nodes matched by their labels.
    services.autoscale_pass()
    run_queued(agent)
    cluster.refresh_from_db()
    assert {n["member_id"] for n in cluster.last_status["nodes"]} == {
        str(worker.pk),
        str(cluster.ray_nodes.get(role="head").pk),
    }
    assert "gcs" in cluster.last_status["logs"]

    # Scale down: min 0, the idle worker is drained through the head and then stopped.
    services.ray_cluster_update(actor=owner, cluster=cluster, min_workers=0)

    def worker_idle_decided() -> bool:
        services.autoscale_pass()  # decides on the previous status, asks for the next
        run_queued(agent)
        worker.refresh_from_db()
        return worker.status != RayNodeStatus.RUNNING

    wait_until(worker_idle_decided, timeout=90, interval=1.0, what="the autoscaler to remove the idle worker")
    assert cluster.events.filter(kind="autoscaler", message__contains="removing worker").exists()
    run_queued(agent)  # the stop that follows the drain
    worker.refresh_from_db()
    assert worker.status == RayNodeStatus.STOPPED
    assert Command.objects.get(command_type="ray.node.drain").status == CommandStatus.SUCCEEDED

    # Stop the cluster: the head process goes.
    services.ray_cluster_stop(actor=owner, cluster=cluster)
    run_queued(agent)
    assert set(cluster.ray_nodes.values_list("status", flat=True)) == {RayNodeStatus.STOPPED}
    assert agent.process_runtime.nodes() == []
