"""The Ray job queue on real Ray: three jobs of different priorities, queued behind a running one on a cluster
whose one Ray node offers 1 CPU, run in priority order.

The control plane's services dispatch every command; the agent's `RayCommandHandler` (process runtime)
executes each with the payload as the agent receives it, and its outcome is recorded through fleet's
command_record_* services, as over the tunnel. The cluster's CPUs are what real Ray reports (`ray.status`).
A queued job starts on the event of the one before it finishing (the dispatch task run in-process).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import current_app

from agent.ray.commands import RayCommandHandler
from agent.ray.ports import free_port
from agent.ray.process_runtime import RayProcessRuntime
from fleet import enqueue
from raymgr.services import ray_cluster_autoscale
from raymgr.workloads import selectors, services
from raymgr.workloads.models import JobStatus, TrainingJob
from tests.raymgr.test_real_ray_workloads import run_queued
from tests.support.processes import VENV_BIN, wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.integration]

BLOCKER = """
import os, time
open({log!r}, "a").write("blocker\\n")
while not os.path.exists({release!r}):
    time.sleep(0.2)
"""
QUICK = 'open({log!r}, "a").write({name!r} + "\\n")\n'


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RayCommandHandler]:
    runtime = RayProcessRuntime(VENV_BIN / "ray", tmp_path / "ray")
    yield RayCommandHandler(process_runtime=runtime, default_num_cpus=1)
    runtime.stop_all()


@pytest.fixture
def events(monkeypatch):
    """The queue's dispatch task, sent after commit, runs here; other tasks are only recorded."""

    def send(task_name, *args, countdown=None):
        if task_name == "raymgr.tasks.dispatch_ray_queue":
            current_app.tasks[task_name].apply(args=args)

    monkeypatch.setattr(enqueue, "send", send)


@pytest.mark.timeout(600)
def test_three_priorities_run_in_priority_order_on_real_ray(
    agent, events, compute, add_node, make_ray, owner, workspace, tmp_path, django_capture_on_commit_callbacks
):
    add_node(compute, "only-box", memory_mb=16000)
    cluster = make_ray(runtime="process", gcs_port=free_port(), dashboard_port=free_port(), max_workers=0)
    run_queued(agent)
    cluster.refresh_from_db()
    assert cluster.status == "running", cluster.failure_reason
    ray_cluster_autoscale(cluster=cluster)  # asks the head for ray.status: what Ray really offers
    run_queued(agent)
    assert cluster.ray_nodes.get().resources.get("CPU") == 1.0

    log, release = tmp_path / "order.log", tmp_path / "release"

    def create(name: str, priority: int, script: str) -> TrainingJob:
        return services.training_job_create(
            actor=owner, workspace=workspace, ray_cluster=cluster, name=name, script=script, priority=priority
        )

    create("blocker", 0, BLOCKER.format(log=str(log), release=str(release)))
    run_queued(agent)
    wait_until(lambda: log.exists(), timeout=120, what="the blocker to run on Ray")
    for name, priority in (("low", 10), ("high", 90), ("mid", 50)):
        row = create(name, priority, QUICK.format(log=str(log), name=name))
        assert row.submitted_at is None, row.queue_reason
    positions = selectors.queue_positions(cluster.pk)
    assert sorted(positions.values()) == [1, 2, 3]
    assert [TrainingJob.objects.get(pk=pk).name for pk in sorted(positions, key=positions.get)] == [
        "high",
        "mid",
        "low",
    ]
    release.touch()

    def step() -> bool:
        with django_capture_on_commit_callbacks(execute=True):
            services.workloads_poll()
            run_queued(agent)
        return not TrainingJob.objects.filter(status__in=JobStatus.active()).exists()

    wait_until(step, timeout=420, interval=1.0, what="the four jobs to finish")
    failed = {j.name: j.traceback or j.failure_reason for j in TrainingJob.objects.exclude(status="succeeded")}
    assert failed == {}
    assert log.read_text().split() == ["blocker", "high", "mid", "low"]
