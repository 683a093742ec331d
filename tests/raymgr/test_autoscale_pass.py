"""The beat pass: stored head status → autoscaler.decide → events with reasons → worker commands."""

from __future__ import annotations

import pytest
from django.conf import settings

from fleet.models import Command
from raymgr import services, tasks
from raymgr.models import RayNode, RayNodeStatus
from tests.raymgr.conftest import finish, last_command, start_head

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(compute, add_node, make_ray):
    """A running cluster (head on cpu-head) with two more 8-CPU nodes for workers."""
    add_node(compute, "cpu-head", memory_mb=128000)
    add_node(compute, "w-1")
    add_node(compute, "w-2")
    cluster = make_ray(max_workers=2, idle_timeout_s=60)
    start_head(cluster)
    return cluster


def head_of(cluster) -> RayNode:
    return RayNode.objects.get(ray_cluster=cluster, role="head")


def status(cluster, *, pending=(), workers=(), head_free=None):
    head = head_of(cluster)
    nodes = [
        {
            "member_id": str(head.pk),
            "ray_node_id": head.ray_node_id,
            "is_head": True,
            "alive": True,
            "resources": {"CPU": 2.0},
            "available": head_free if head_free is not None else {"CPU": 0.0},
            "cpu_percent": 55.0,
            "memory_percent": 30.0,
            "running_tasks": 2,
        },
        *workers,
    ]
    return {"nodes": nodes, "pending": list(pending), "logs": {"gcs": "gcs line", "autoscaler": "as line"}}


def feed_status(cluster, body) -> Command:
    """Run a pass (which asks the head for status) and answer that ray.status command with `body`."""
    asks = Command.objects.filter(command_type="ray.status", payload__cluster_id=str(cluster.pk), status="queued")
    if not asks.exists():
        services.autoscale_pass()
    command = asks.select_related("node").get()
    finish(command, data=body)
    cluster.refresh_from_db()
    return command


def test_beat_schedule_runs_the_pass():
    entry = settings.CELERY_BEAT_SCHEDULE["raymgr-autoscale"]
    assert entry["task"] == tasks.autoscale.name


def test_pass_asks_the_head_for_status_once(running):
    assert tasks.autoscale() == 1
    asks = Command.objects.filter(command_type="ray.status", payload__cluster_id=str(running.pk))
    assert asks.count() == 1
    assert asks.get().node_id == running.head_node_id
    assert asks.get().payload["gcs_port"] == running.gcs_port
    services.autoscale_pass()
    assert asks.count() == 1  # still in flight: not asked again


def test_status_result_is_stored_with_head_usage(running):
    feed_status(running, status(running))
    assert running.last_status["logs"]["gcs"] == "gcs line"
    head = head_of(running)
    assert (head.cpu_percent, head.memory_percent, head.running_tasks) == (55.0, 30.0, 2)


def test_pending_demand_adds_workers_and_records_the_reasons(running):
    feed_status(running, status(running, pending=[{"CPU": 4.0}, {"CPU": 4.0}, {"CPU": 32.0}]))
    decision = services.ray_cluster_autoscale(cluster=running)
    assert decision.add == 1  # both 4-CPU bundles fit one 16-CPU worker (the node shape)
    event = running.events.filter(kind="autoscaler").first()
    assert "adding 1 worker(s)" in event.message
    assert event.data["add"] == 1
    assert any("pending bundle(s) exceed free capacity" in r for r in event.data["reasons"])
    assert any("{CPU: 32} is larger than the worker shape {CPU: 16}" in r for r in event.data["reasons"])
    starts = Command.objects.filter(command_type="ray.worker.start", payload__cluster_id=str(running.pk))
    assert starts.count() == 1
    # The same status is not decided on twice: the next pass adds nothing more.
    services.ray_cluster_autoscale(cluster=running)
    assert starts.count() == 1


def test_idle_worker_is_drained_through_the_head_then_stopped(running):
    services.ray_cluster_update(actor=running.created_by, cluster=running, min_workers=1)
    services.ray_cluster_autoscale(cluster=running)  # below min: one worker
    start = last_command("ray.worker.start", cluster_id=str(running.pk))
    finish(start, data={"container_id": "c-w1", "ray_node_id": "ab" * 28})
    worker = RayNode.objects.get(pk=start.payload["member_id"])
    services.ray_cluster_update(actor=running.created_by, cluster=running, min_workers=0)
    idle = {"member_id": str(worker.pk), "alive": True, "resources": {"CPU": 16.0}, "idle_s": 300.0}
    feed_status(running, status(running, workers=[idle]))
    decision = services.ray_cluster_autoscale(cluster=running)
    assert decision.remove == [str(worker.pk)]
    assert "idle 300s > 60s" in running.events.filter(kind="autoscaler").first().message
    drain = last_command("ray.node.drain", member_id=str(worker.pk))
    assert drain.node_id == running.head_node_id
    assert drain.payload["ray_node_id"] == "ab" * 28
    worker.refresh_from_db()
    assert worker.status == RayNodeStatus.DRAINING
    assert not Command.objects.filter(command_type="ray.node.stop").exists()  # not before the drain
    finish(drain)
    stop = last_command("ray.node.stop", member_id=str(worker.pk))
    assert (stop.node_id, stop.payload["container"]) == (worker.node_id, "c-w1")
    finish(stop)
    worker.refresh_from_db()
    assert worker.status == RayNodeStatus.STOPPED


def test_min_workers_are_kept_when_one_fails(running):
    services.ray_cluster_update(actor=running.created_by, cluster=running, min_workers=1)
    services.ray_cluster_autoscale(cluster=running)
    first = last_command("ray.worker.start", cluster_id=str(running.pk))
    finish(first, ok=False, code="image_pull_failed", message="no such image")
    assert running.events.filter(kind="worker_failed", message__contains="no such image").exists()
    decision = services.ray_cluster_autoscale(cluster=running)
    assert decision.add == 1
    assert any("below min_workers" in r for r in decision.reasons)
    assert Command.objects.filter(command_type="ray.worker.start").count() == 2


def test_unchanged_decisions_are_not_repeated_in_the_log(running):
    services.autoscale_pass()
    services.autoscale_pass()
    messages = list(running.events.filter(kind="autoscaler").values_list("message", flat=True))
    assert len(messages) == 1
    assert messages[0].startswith("no change: 0 live worker(s)")


def test_stopped_clusters_are_not_autoscaled(running, owner):
    services.ray_cluster_stop(actor=owner, cluster=running)
    assert services.autoscale_pass() == 0
    assert not running.events.filter(kind="autoscaler").exists()


def test_a_drain_ray_refuses_keeps_the_worker(running):
    services.ray_cluster_update(actor=running.created_by, cluster=running, min_workers=1)
    services.ray_cluster_autoscale(cluster=running)
    start = last_command("ray.worker.start", cluster_id=str(running.pk))
    finish(start, data={"container_id": "c-w1", "ray_node_id": "cd" * 28})
    worker = RayNode.objects.get(pk=start.payload["member_id"])
    services.ray_cluster_update(actor=running.created_by, cluster=running, min_workers=0)
    idle = {"member_id": str(worker.pk), "alive": True, "resources": {"CPU": 16.0}, "idle_s": 90.0}
    feed_status(running, status(running, workers=[idle]))
    services.ray_cluster_autoscale(cluster=running)
    drain = last_command("ray.node.drain", member_id=str(worker.pk))
    finish(drain, ok=False, code="conflict", message="node is not idle")
    worker.refresh_from_db()
    assert worker.status == RayNodeStatus.RUNNING
    assert not Command.objects.filter(command_type="ray.node.stop").exists()
    assert running.events.filter(kind="drain_refused").exists()


def test_worker_usage_falls_back_to_its_fleet_nodes_heartbeat(running):
    services.ray_cluster_update(actor=running.created_by, cluster=running, min_workers=1)
    services.ray_cluster_autoscale(cluster=running)
    start = last_command("ray.worker.start", cluster_id=str(running.pk))
    finish(start, data={"ray_node_id": "ef" * 28})
    worker = RayNode.objects.select_related("node").get(pk=start.payload["member_id"])
    entry = {"ray_node_id": "ef" * 28, "alive": True, "resources": {"CPU": 16.0}, "running_tasks": 3}
    feed_status(running, status(running, workers=[entry]))
    worker.refresh_from_db()
    assert worker.running_tasks == 3
    assert worker.cpu_percent == worker.node.cpu_percent == 5.0
    assert worker.memory_percent == pytest.approx(worker.node.memory_percent)
