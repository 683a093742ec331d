"""Ray cluster services on the real database; agent answers fed through fleet's command_record_* services."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from agent import protocol
from fleet.models import Command
from kernel.exceptions import IllegalTransition
from raymgr import services
from raymgr.models import RayCluster, RayClusterEvent, RayClusterStatus, RayNode, RayNodeStatus
from raymgr.services.common import dispatch
from tests.raymgr.conftest import finish, last_command, start_head

pytestmark = pytest.mark.django_db


def test_create_places_head_on_cpu_node_and_dispatches_head_start(compute, add_node, make_ray):
    add_node(compute, "gpu-1", gpus=2, memory_mb=512000)
    cpu = add_node(compute, "cpu-1", memory_mb=32000)
    cluster = make_ray(min_workers=1)
    assert cluster.status == RayClusterStatus.PENDING
    assert cluster.head_node_id == cpu.pk
    assert cluster.head_hostname == "cpu-1"
    command = last_command("ray.head.start", cluster_id=str(cluster.pk))
    assert command.node_id == cpu.pk
    assert command.payload["image"] == "rayproject/ray:2.9.0"
    assert command.payload["gcs_port"] == 6380
    assert command.payload["dashboard_port"] == 8265
    head = RayNode.objects.get(ray_cluster=cluster, role="head")
    assert head.start_command_id == command.pk
    assert command.payload["member_id"] == str(head.pk)
    assert cluster.events.filter(kind="placement").exists()


def test_ray_commands_are_sent_only_as_their_protocol_payloads(compute, add_node, make_ray, owner):
    add_node(compute, "cpu-1", memory_mb=32000)
    cluster = make_ray()
    head = RayNode.objects.get(ray_cluster=cluster, role="head")
    sent = last_command("ray.head.start", cluster_id=str(cluster.pk))
    assert isinstance(sent.parsed_payload, protocol.RayHeadStartPayload)
    before = Command.objects.count()
    as_dict = {"cluster_id": str(cluster.pk), "member_id": str(head.pk)}
    with pytest.raises(TypeError, match=r"ray\.status payload is built as its protocol dataclass, not dict"):
        dispatch(owner, head.node, "ray.status", as_dict)
    with pytest.raises(TypeError, match="not RayNodeStopPayload"):
        dispatch(owner, head.node, "ray.status", protocol.RayNodeStopPayload(**as_dict))
    assert Command.objects.count() == before


def test_head_result_makes_it_running_and_starts_min_workers_on_other_nodes(compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    gpu = add_node(compute, "gpu-1", gpus=1)
    add_node(compute, "cpu-2")
    cluster = make_ray(min_workers=2)
    start_head(cluster, ip="10.1.2.3")
    assert cluster.status == RayClusterStatus.RUNNING
    assert (cluster.head_ip, cluster.head_container_id) == ("10.1.2.3", "c-head")
    assert cluster.started_at is not None
    starts = list(Command.objects.filter(command_type="ray.worker.start").order_by("created_at"))
    assert len(starts) == 2
    assert {c.node.hostname for c in starts} == {"gpu-1", "cpu-2"}
    assert all(c.payload["head_address"] == "10.1.2.3:6380" for c in starts)
    gpu_start = next(c for c in starts if c.node_id == gpu.pk)
    assert gpu_start.payload["image"] == "rayproject/ray:2.9.0-gpu"
    assert gpu_start.payload["num_gpus"] == 1
    finish(gpu_start, data={"container_id": "c-w", "ray_node_id": "bb" * 28, "ip": "10.1.2.4"})
    worker = RayNode.objects.get(pk=gpu_start.payload["member_id"])
    assert (worker.status, worker.container_id, worker.ray_node_id) == ("running", "c-w", "bb" * 28)


def test_duplicate_result_delivery_does_not_start_workers_twice(compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    add_node(compute, "cpu-2")
    cluster = make_ray(min_workers=1)
    command = start_head(cluster)
    services.ray_on_command_finished(command=Command.objects.get(pk=command.pk))
    assert Command.objects.filter(command_type="ray.worker.start").count() == 1


def test_head_failure_fails_the_cluster_with_the_agents_reason(compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    command = last_command("ray.head.start", cluster_id=str(cluster.pk))
    finish(command, ok=False, code="conflict", message="port 6380 is already in use")
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.FAILED
    assert "conflict: port 6380 is already in use" in cluster.failure_reason
    assert RayNode.objects.get(ray_cluster=cluster).status == RayNodeStatus.FAILED


def test_placement_failure_no_nodes_online(compute, add_node, make_ray):
    add_node(compute, "off", online=False)
    cluster = make_ray()
    assert cluster.status == RayClusterStatus.FAILED
    assert cluster.failure_reason.startswith("No nodes online")
    assert not Command.objects.exists()


def test_placement_failure_insufficient_memory(compute, add_node, make_ray):
    add_node(compute, "small", memory_mb=8000, used_mb=6000)
    cluster = make_ray()
    assert cluster.status == RayClusterStatus.FAILED
    assert "Insufficient memory" in cluster.failure_reason
    assert "2000 MB free" in cluster.failure_reason


def test_placement_failure_port_conflict_with_another_ray_cluster(compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    first = make_ray("first", gcs_port=6390)
    assert first.status == RayClusterStatus.PENDING
    second = make_ray("second", gcs_port=6391)  # same dashboard port 8265 on the only node
    assert second.status == RayClusterStatus.FAILED
    assert "Port conflict" in second.failure_reason
    assert "8265" in second.failure_reason
    third = make_ray("third", gcs_port=6392, dashboard_port=8266)
    assert third.status == RayClusterStatus.PENDING


def test_state_machine_refuses_illegal_transitions(compute, add_node, make_ray, owner):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    with pytest.raises(IllegalTransition, match="pending Ray cluster cannot become pending"):
        services.ray_cluster_start(actor=owner, cluster=cluster)
    services.ray_cluster_stop(actor=owner, cluster=cluster)
    finish(last_command("ray.node.stop", cluster_id=str(cluster.pk)))  # its head's stop finished
    with pytest.raises(IllegalTransition, match="stopped Ray cluster cannot become running"):
        services.ray_cluster_transition(cluster=cluster, to=RayClusterStatus.RUNNING)
    with pytest.raises(IllegalTransition, match="stopped Ray cluster cannot become stopping"):
        services.ray_cluster_stop(actor=owner, cluster=cluster)
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPED
    statuses = list(cluster.events.filter(kind="status").values_list("data__status", flat=True))
    assert statuses == ["stopped", "stopping"]  # newest first


def test_status_changed_at_moves_with_each_transition(compute, add_node, make_ray, owner):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    created = cluster.status_changed_at
    start_head(cluster)
    assert cluster.status_changed_at > created


def test_stop_stops_every_node_and_start_brings_head_back(compute, add_node, make_ray, owner):
    add_node(compute, "cpu-1")
    add_node(compute, "cpu-2")
    cluster = make_ray(min_workers=1)
    start_head(cluster)
    worker_start = last_command("ray.worker.start", cluster_id=str(cluster.pk))
    finish(worker_start, data={"container_id": "c-w", "ray_node_id": "cc" * 28})
    cluster = services.ray_cluster_stop(actor=owner, cluster=cluster)
    assert cluster.status == RayClusterStatus.STOPPING
    stops = list(Command.objects.filter(command_type="ray.node.stop", payload__cluster_id=str(cluster.pk)))
    assert len(stops) == 2
    assert {c.payload["container"] for c in stops} == {"c-head", "c-w"}
    for stop in stops:
        finish(stop)
    assert set(RayNode.objects.filter(ray_cluster=cluster).values_list("status", flat=True)) == {"stopped"}
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPED
    cluster = services.ray_cluster_start(actor=owner, cluster=cluster)
    assert cluster.status == RayClusterStatus.PENDING
    assert Command.objects.filter(command_type="ray.head.start").count() == 2
    start_head(cluster)
    assert cluster.status == RayClusterStatus.RUNNING
    assert Command.objects.filter(command_type="ray.worker.start").count() == 2


def test_a_head_that_starts_after_stop_is_stopped_again(compute, add_node, make_ray, owner):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    command = last_command("ray.head.start", cluster_id=str(cluster.pk))
    services.ray_cluster_stop(actor=owner, cluster=cluster)
    finish(last_command("ray.node.stop", cluster_id=str(cluster.pk)), data={"stopped": False})  # ran first
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPED
    finish(command, data={"container_id": "late"})
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPING  # the late head runs: stopping it again
    late_stop = last_command("ray.node.stop", container="late")
    assert late_stop is not None
    finish(late_stop)
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPED


def test_delete_waits_for_stops_then_removes_the_row(compute, add_node, make_ray, owner):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    start_head(cluster)
    assert services.ray_cluster_delete(actor=owner, cluster=cluster) is not None
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.DELETING
    with pytest.raises(IllegalTransition):
        services.ray_cluster_start(actor=owner, cluster=cluster)
    stop = last_command("ray.node.stop", cluster_id=str(cluster.pk))
    finish(stop)
    assert not RayCluster.objects.filter(pk=cluster.pk).exists()
    assert not RayClusterEvent.objects.filter(ray_cluster_id=cluster.pk).exists()


def test_delete_of_a_failed_cluster_is_immediate(compute, make_ray, owner):
    cluster = make_ray()  # no nodes: failed
    assert services.ray_cluster_delete(actor=owner, cluster=cluster) is None
    assert not RayCluster.objects.exists()


def test_only_owners_and_admins_manage_ray_clusters(compute, add_node, workspace, member_of):
    add_node(compute, "cpu-1")
    for role in ("member", "viewer"):
        with pytest.raises(PermissionDenied):
            services.ray_cluster_create(
                actor=member_of(workspace, role), workspace=workspace, compute_cluster=compute, name="x"
            )
    admin = member_of(workspace, "admin")
    cluster = services.ray_cluster_create(actor=admin, workspace=workspace, compute_cluster=compute, name="x")
    assert cluster.created_by == admin


def test_field_errors(compute, make_ray, other_workspace, owner, workspace):
    make_ray("dup")
    with pytest.raises(ValidationError) as err:
        make_ray("dup")
    assert "name" in err.value.message_dict
    with pytest.raises(ValidationError) as err:
        make_ray("Bad Name", min_workers=3, max_workers=2, ray_version="latest")
    assert {"max_workers"} <= set(err.value.message_dict)
    with pytest.raises(ValidationError) as err:
        make_ray("ok-name", ray_version="latest")
    assert "ray_version" in err.value.message_dict
    from fleet import services as fleet_services

    theirs = fleet_services.cluster_create(
        actor=other_workspace.memberships.get().user, workspace=other_workspace, name="theirs"
    )
    with pytest.raises(ValidationError) as err:
        services.ray_cluster_create(actor=owner, workspace=workspace, compute_cluster=theirs, name="cross")
    assert "compute_cluster" in err.value.message_dict


def test_version_is_immutable_while_running(compute, add_node, make_ray, owner, settings):
    settings.RAY_VERSIONS = ["2.9.0", "2.61.0"]
    add_node(compute, "cpu-1")
    cluster = make_ray()
    start_head(cluster)
    with pytest.raises(ValidationError) as err:
        services.ray_cluster_update(actor=owner, cluster=cluster, ray_version="2.61.0")
    assert "ray_version" in err.value.message_dict
    services.ray_cluster_update(actor=owner, cluster=cluster, max_workers=4)
    services.ray_cluster_stop(actor=owner, cluster=cluster)
    finish(last_command("ray.node.stop", cluster_id=str(cluster.pk)))
    cluster = services.ray_cluster_update(actor=owner, cluster=cluster, ray_version="2.61.0")
    assert (cluster.ray_version, cluster.max_workers) == ("2.61.0", 4)


def test_a_head_that_dies_fails_the_cluster_and_stops_its_workers(compute, add_node, make_ray, owner):
    add_node(compute, "cpu-1")
    add_node(compute, "cpu-2")
    cluster = make_ray(min_workers=1)
    start_head(cluster)
    finish(last_command("ray.worker.start", cluster_id=str(cluster.pk)), data={"container_id": "c-w"})
    services.autoscale_pass()
    status = last_command("ray.status", cluster_id=str(cluster.pk))
    finish(status, ok=False, code="not_found", message="the Ray head is not running here")
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.FAILED
    assert "not running" in cluster.failure_reason
    stop = last_command("ray.node.stop", container="c-w")
    assert stop is not None
    # Start again: a new head is placed; nothing from the old run is left running afterwards.
    finish(stop)
    cluster = services.ray_cluster_start(actor=owner, cluster=cluster)
    assert cluster.status == RayClusterStatus.PENDING
    assert RayNode.objects.filter(ray_cluster=cluster, status="starting", role="head").count() == 1


def test_process_runtime_refuses_the_redis_port(compute, make_ray):
    with pytest.raises(ValidationError) as err:
        make_ray(runtime="process", gcs_port=6379)
    assert "gcs_port" in err.value.message_dict


def test_without_owners_or_admins_results_still_advance_state_but_start_nothing(
    compute, add_node, make_ray, workspace, owner
):
    from tenancy import services as tenancy_services

    add_node(compute, "cpu-1")
    cluster = make_ray(min_workers=1)
    command = last_command("ray.head.start", cluster_id=str(cluster.pk))
    tenancy_services.membership_set(workspace=workspace, user=owner, role="viewer")  # no operator left
    done = finish(command, data={"container_id": "c-head", "ip": "10.0.0.1"})
    assert done.status == "succeeded"
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.RUNNING  # no Owner/Admin: no worker follow-ups, no error
    assert not Command.objects.filter(command_type="ray.worker.start").exists()


# --- a stop is "stopping" until its Ray nodes have stopped; no second stop while one is in flight ----------


def statuses(cluster):
    return list(cluster.events.filter(kind="status").order_by("created_at").values_list("data__status", flat=True))


def test_stop_is_stopping_until_every_ray_node_has_stopped_and_start_waits_for_it(compute, add_node, make_ray, owner):
    add_node(compute, "cpu-1")
    add_node(compute, "cpu-2")
    cluster = make_ray(min_workers=1)
    start_head(cluster)
    finish(last_command("ray.worker.start", cluster_id=str(cluster.pk)), data={"container_id": "c-w"})
    cluster = services.ray_cluster_stop(actor=owner, cluster=cluster)
    assert cluster.status == RayClusterStatus.STOPPING  # its containers still run
    with pytest.raises(IllegalTransition, match="still stopping: wait until it has stopped"):
        services.ray_cluster_start(actor=owner, cluster=cluster)
    with pytest.raises(IllegalTransition, match="stopping Ray cluster cannot become stopping"):
        services.ray_cluster_stop(actor=owner, cluster=cluster)
    head_stop, worker_stop = (
        last_command("ray.node.stop", container="c-head"),
        last_command("ray.node.stop", container="c-w"),
    )
    finish(worker_stop)
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPING  # the head still runs
    finish(head_stop)
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPED
    assert statuses(cluster)[-2:] == ["stopping", "stopped"]
    cluster = services.ray_cluster_start(actor=owner, cluster=cluster)
    assert cluster.status == RayClusterStatus.PENDING


def test_a_stopping_clusters_head_still_holds_its_ports(compute, add_node, make_ray, owner):
    add_node(compute, "cpu-1")
    first = make_ray("first", gcs_port=6390)
    start_head(first)
    services.ray_cluster_stop(actor=owner, cluster=first)
    second = make_ray("second", gcs_port=6390, dashboard_port=8266)
    assert second.status == RayClusterStatus.FAILED
    assert "Port conflict" in second.failure_reason


def test_stop_of_a_cluster_with_nothing_running_is_stopped_at_once(compute, make_ray, owner):
    cluster = make_ray()  # no nodes: failed, nothing live
    cluster = services.ray_cluster_stop(actor=owner, cluster=cluster)
    assert cluster.status == RayClusterStatus.STOPPED


def test_a_stop_that_never_finishes_is_given_up_after_the_grace(compute, add_node, make_ray, owner):
    import datetime as dt

    from django.utils import timezone

    add_node(compute, "cpu-1")
    cluster = make_ray()
    start_head(cluster)
    services.ray_cluster_stop(actor=owner, cluster=cluster)
    services.autoscale_pass()
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPING
    RayCluster.objects.filter(pk=cluster.pk).update(status_changed_at=timezone.now() - dt.timedelta(hours=1))
    services.autoscale_pass()
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPED
    head = RayNode.objects.get(ray_cluster=cluster)
    assert head.status == RayNodeStatus.STOPPED
    assert "no answer" in head.failure_reason


def test_delete_right_after_stop_sends_no_second_stop(compute, add_node, make_ray, owner):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    start_head(cluster)
    services.ray_cluster_stop(actor=owner, cluster=cluster)
    assert services.ray_cluster_delete(actor=owner, cluster=RayCluster.objects.get(pk=cluster.pk)) is not None
    stops = Command.objects.filter(command_type="ray.node.stop", payload__cluster_id=str(cluster.pk))
    assert stops.count() == 1  # the head's stop in flight is the one the delete waits for
    assert RayCluster.objects.get(pk=cluster.pk).status == RayClusterStatus.DELETING
    finish(stops.get())
    assert not RayCluster.objects.filter(pk=cluster.pk).exists()


def test_a_head_started_while_its_stop_was_in_flight_is_stopped_once_that_stop_is_over(
    compute, add_node, make_ray, owner
):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    start = last_command("ray.head.start", cluster_id=str(cluster.pk))
    services.ray_cluster_stop(actor=owner, cluster=cluster)
    stop = last_command("ray.node.stop", cluster_id=str(cluster.pk))
    finish(start, data={"container_id": "late"})  # the start won the race on the agent
    assert Command.objects.filter(command_type="ray.node.stop").count() == 1  # no second stop in flight
    finish(stop, data={"stopped": False})  # that stop found nothing to stop: it ran before the start
    again = last_command("ray.node.stop", container="late")
    assert again is not None
    assert again.pk != stop.pk
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPING
    finish(again)
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPED


# --- the default GCS port: none, picked free on the head's node (never Redis's 6379) -----------------------


def test_the_default_gcs_port_is_picked_on_the_heads_node_never_redis(compute, add_node, owner, workspace):
    add_node(compute, "cpu-1")
    add_node(compute, "cpu-2")
    for runtime, dashboard in (("docker", 8265), ("process", 8266)):
        cluster = services.ray_cluster_create(
            actor=owner,
            workspace=workspace,
            compute_cluster=compute,
            name=f"d-{runtime}",
            runtime=runtime,
            min_workers=1,
            dashboard_port=dashboard,
        )
        assert cluster.status == RayClusterStatus.PENDING, cluster.failure_reason
        assert cluster.gcs_port is None
        start = last_command("ray.head.start", cluster_id=str(cluster.pk))
        assert start.payload["gcs_port"] == 0  # the agent picks a free port on its machine
        finish(start, data={"container_id": "c", "ip": "10.0.0.1", "gcs_port": 23456})
        cluster.refresh_from_db()
        assert cluster.status == RayClusterStatus.RUNNING
        assert cluster.gcs_address == "10.0.0.1:23456"
        worker = last_command("ray.worker.start", cluster_id=str(cluster.pk))
        assert worker.payload["head_address"] == "10.0.0.1:23456"
        services.autoscale_pass()
        assert last_command("ray.status", cluster_id=str(cluster.pk)).payload["gcs_port"] == 23456


def _running_worker(compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    add_node(compute, "cpu-2")
    cluster = make_ray(min_workers=1)
    start_head(cluster)
    start = last_command("ray.worker.start", cluster_id=str(cluster.pk))
    finish(start, data={"container_id": "c-w", "ray_node_id": "bb" * 28})
    return cluster, RayNode.objects.get(pk=start.payload["member_id"])


def test_a_worker_ray_no_longer_lists_fails_and_its_agent_is_told_to_remove_it(
    compute, add_node, make_ray, django_capture_on_commit_callbacks
):
    cluster, worker = _running_worker(compute, add_node, make_ray)
    head = RayNode.objects.get(ray_cluster=cluster, role="head")
    status = {"nodes": [{"member_id": str(head.pk), "ray_node_id": "aa" * 28, "is_head": True}]}
    with django_capture_on_commit_callbacks(execute=True):
        services.ray_cluster_record_status(cluster=cluster, status=status)
    worker.refresh_from_db()
    assert worker.status == RayNodeStatus.FAILED
    # its killed container stays on its node unless its agent removes it: a stop goes to that node
    stop = last_command("ray.node.stop", member_id=str(worker.pk))
    assert stop is not None
    assert (stop.node_id, stop.payload["container"], stop.payload["runtime"]) == (worker.node_id, "c-w", "docker")
    finish(stop)
    worker.refresh_from_db()
    assert worker.status == RayNodeStatus.FAILED  # the removal changes nothing: failed, with its reason
    assert "no longer lists this worker" in worker.failure_reason
    services.ray_cluster_record_status(cluster=cluster, status=status)  # a later status sends nothing more
    assert Command.objects.filter(command_type="ray.node.stop", payload__member_id=str(worker.pk)).count() == 1


def test_a_head_found_not_running_is_removed_from_its_node(
    compute, add_node, make_ray, django_capture_on_commit_callbacks
):
    cluster, _ = _running_worker(compute, add_node, make_ray)
    head = RayNode.objects.get(ray_cluster=cluster, role="head")
    services.autoscale_pass()
    with django_capture_on_commit_callbacks(execute=True):
        finish(last_command("ray.status", cluster_id=str(cluster.pk)), ok=False, code="not_found", message="exited")
    head.refresh_from_db()
    assert head.status == RayNodeStatus.FAILED
    stop = last_command("ray.node.stop", member_id=str(head.pk))
    assert stop is not None
    assert stop.node_id == head.node_id
