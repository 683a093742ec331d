"""The Ray job queue survives a Celery worker restart: the queue lives in PostgreSQL and its events in the Redis
broker, so a job finishing while no worker runs starts the next queued job once a worker is back.

A real Celery worker (solo pool) consumes the real broker; the head's answers are fed through fleet's
services as in the other raymgr tests (no Ray processes: tests/raymgr/test_real_ray_workloads.py runs those).
"""

from __future__ import annotations

import time

import pytest
from django.db import connection

from fleet.models import Command
from raymgr.workloads import services
from raymgr.workloads.models import JobStatus, TrainingJob
from tests.raymgr.conftest import confirm_submissions, finish, last_command, start_head
from tests.support.processes import celery_worker, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SCRIPT = "print('hi')\n"


def _worker(tmp_path, name: str):
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    tmp_path.mkdir(exist_ok=True)
    return celery_worker(tmp_path, queues="default", env={"DATABASE_URL": url}, name=name)


def _submitted(name: str) -> bool:
    row = TrainingJob.objects.get(name=name)
    return Command.objects.filter(command_type="ray.job.submit", payload__submission_id=row.submission_id).exists()


def _succeed(name: str) -> None:
    row = TrainingJob.objects.get(name=name)
    confirm_submissions()
    services.workloads_poll()  # asks the head for the job's status (the cluster is full: nothing starts)
    finish(last_command("ray.job.status", submission_id=row.submission_id), data={"status": "SUCCEEDED"})
    assert TrainingJob.objects.get(name=name).status == JobStatus.SUCCEEDED


@pytest.mark.timeout(240)
def test_queued_jobs_start_in_order_across_a_worker_restart(tmp_path, owner, workspace, compute, add_node, make_ray):
    add_node(compute, "box-1")
    cluster = make_ray(runtime="process", max_workers=0)
    start_head(cluster)
    cluster.ray_nodes.update(resources={"CPU": 1.0})  # room for one 1-CPU job at a time
    for name, priority in (("blocker", 0), ("low", 10), ("high", 90)):
        services.training_job_create(
            actor=owner, workspace=workspace, ray_cluster=cluster, name=name, script=SCRIPT, priority=priority
        )
    assert [_submitted(n) for n in ("blocker", "low", "high")] == [True, False, False]

    first = _worker(tmp_path / "a", "queue-a")
    try:
        wait_until(lambda: "ready" in first.log(), timeout=90, what="the first worker")
    finally:
        first.stop()  # the worker goes away (a deploy, a crash) ...
    _succeed("blocker")  # ... while the capacity-freed event is sent to the broker
    time.sleep(2)
    assert not _submitted("high")  # nobody consumed the event yet; nothing retries it on a timer either

    second = _worker(tmp_path / "b", "queue-b")
    try:
        wait_until(lambda: _submitted("high"), timeout=120, what="the restarted worker to start the queue's head")
        assert not _submitted("low")
        _succeed("high")
        wait_until(lambda: _submitted("low"), timeout=60, what="the next event to start the last job")
        assert "raymgr.tasks.dispatch_ray_queue" in second.log()
    finally:
        second.stop()
