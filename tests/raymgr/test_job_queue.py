"""The Ray job queue: priority order, fairness, position and reason (page and API), cancel, queue timeout, and
start by an event (a job finishing), on the real database with the head's answers fed through fleet services."""

from __future__ import annotations

import datetime as dt

import pytest
from celery import current_app
from django.test import Client
from django.utils import timezone

from fleet import enqueue
from fleet.models import Command
from raymgr.workloads import queue, selectors, services
from raymgr.workloads.models import JobStatus, TrainingJob
from tests.raymgr.conftest import confirm_submissions, finish, last_command, start_head

pytestmark = pytest.mark.django_db

SCRIPT = "print('hi')\n"
API = "/api/v1/ray/"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def e(key: str, ws: str, priority: int, minute: int, cpus: float = 1.0) -> queue.Entry:
    return queue.Entry(key, ws, priority, T0 + dt.timedelta(minutes=minute), cpus, 0.0)


def keys(entries: list[queue.Entry]) -> list[str]:
    return [entry.key for entry in entries]


def test_order_is_priority_then_fifo():
    entries = [e("a", "w", 10, 0), e("b", "w", 90, 1), e("c", "w", 50, 2), e("d", "w", 90, 3)]
    assert keys(queue.order(entries)) == ["b", "d", "c", "a"]


def test_order_lets_workspaces_take_turns_within_a_priority():
    # Workspace A queued three jobs before B queued two: within priority 50 they alternate, A first (it came first).
    entries = [e("a1", "A", 50, 0), e("a2", "A", 50, 1), e("a3", "A", 50, 2), e("b1", "B", 50, 3), e("b2", "B", 50, 4)]
    assert keys(queue.order(entries)) == ["a1", "b1", "a2", "b2", "a3"]
    # A higher priority still goes first, whoever queued it.
    assert keys(queue.order([*entries, e("b9", "B", 60, 9)]))[0] == "b9"


def test_plan_stops_at_the_first_job_that_does_not_fit():
    entries = [e("big", "w", 90, 0, cpus=4), e("small", "w", 10, 1, cpus=1)]
    start, wait = queue.plan(entries, queue.Free(cpus=2, gpus=0, busy=True))
    assert (keys(start), keys(wait)) == ([], ["big", "small"])  # no backfill past a higher priority
    start, wait = queue.plan(entries, queue.Free(cpus=0, gpus=0, busy=False))
    assert (keys(start), keys(wait)) == (["big"], ["small"])  # an idle cluster takes the head job whatever its size


@pytest.fixture
def one_slot(compute, add_node, make_ray):
    """A running Ray cluster with room for one 1-CPU job at a time (its one Ray node reports 1 CPU)."""
    add_node(compute, "box-1")
    cluster = make_ray(runtime="process", max_workers=0)
    start_head(cluster)
    cluster.ray_nodes.update(resources={"CPU": 1.0}, available={"CPU": 1.0})
    return cluster


@pytest.fixture
def eager(monkeypatch):
    """The queue's dispatch task, sent after commit, runs in this process (the event path without a worker);
    other tasks (a command's dispatch to its node) are only recorded."""
    sent: list[str] = []

    def send(task_name, *args, countdown=None):
        sent.append(task_name)
        if task_name == "raymgr.tasks.dispatch_ray_queue":
            current_app.tasks[task_name].apply(args=args)

    monkeypatch.setattr(enqueue, "send", send)
    return sent


def job(owner, workspace, cluster, name, **kwargs):
    kwargs.setdefault("script", SCRIPT)
    return services.training_job_create(actor=owner, workspace=workspace, ray_cluster=cluster, name=name, **kwargs)


def submitted(name: str) -> bool:
    job = TrainingJob.objects.get(name=name)
    return Command.objects.filter(command_type="ray.job.submit", payload__submission_id=job.submission_id).exists()


def succeed(name: str, capture) -> None:
    """The head reports the job SUCCEEDED (its status asked by a poll pass, answered on commit)."""
    row = TrainingJob.objects.get(name=name)
    confirm_submissions()
    services.workloads_poll()
    status = last_command("ray.job.status", submission_id=row.submission_id)
    with capture(execute=True):
        finish(status, data={"status": "SUCCEEDED", "logs": "", "markers": []})
    assert TrainingJob.objects.get(name=name).status == JobStatus.SUCCEEDED


def test_three_priorities_start_in_priority_order_on_events(
    owner, workspace, one_slot, eager, django_capture_on_commit_callbacks
):
    job(owner, workspace, one_slot, "blocker", priority=0)
    assert submitted("blocker")  # an idle cluster starts the first job at once
    for name, priority in (("low", 10), ("high", 90), ("mid", 50)):
        row = job(owner, workspace, one_slot, name, priority=priority)
        assert row.status == JobStatus.QUEUED
        assert row.submitted_at is None
    assert {name: submitted(name) for name in ("low", "high", "mid")} == {"low": False, "high": False, "mid": False}
    positions = selectors.queue_positions(one_slot.pk)
    assert {TrainingJob.objects.get(pk=pk).name: p for pk, p in positions.items()} == {"high": 1, "mid": 2, "low": 3}
    high = TrainingJob.objects.get(name="high")
    assert high.queue_reason.startswith("First in the queue of Ray cluster train: needs 1 CPUs and 0 GPUs; 0 CPUs")
    assert "behind 2 jobs of higher or equal priority" in TrainingJob.objects.get(name="low").queue_reason

    order = []
    for finished in ("blocker", "high", "mid"):
        succeed(finished, django_capture_on_commit_callbacks)  # the event: capacity freed
        started = [name for name in ("low", "high", "mid") if submitted(name) and name not in order]
        assert len(started) == 1, (finished, started)
        order += started
    assert order == ["high", "mid", "low"]


def test_position_and_reason_in_the_api_and_the_page(api_client_for, owner, workspace, one_slot):
    job(owner, workspace, one_slot, "first")
    client = api_client_for(owner)
    response = client.post(
        f"{API}training-jobs/",
        {
            "workspace": str(workspace.pk),
            "ray_cluster": str(one_slot.pk),
            "name": "second",
            "script": SCRIPT,
            "priority": 70,
            "queue_timeout_s": 600,
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["status"], data["queue_position"], data["priority"], data["queue_timeout_s"]) == ("queued", 1, 70, 600)
    assert data["status_sentence"].startswith("Queued: First in the queue of Ray cluster train")
    first = client.get(f"{API}training-jobs/", {"status": "queued"}).json()["results"]
    assert {row["name"]: row["queue_position"] for row in first} == {"first": None, "second": 1}
    bad = client.post(
        f"{API}training-jobs/",
        {
            "workspace": str(workspace.pk),
            "ray_cluster": str(one_slot.pk),
            "name": "x",
            "script": SCRIPT,
            "priority": 101,
        },
        format="json",
    )
    assert bad.status_code == 400
    assert "priority" in bad.json()
    browser = Client()
    browser.force_login(owner)
    page = browser.get(f"/ray/training/{data['id']}/").content.decode()
    assert "#1 in the queue" in page
    assert "Priority 70" in page
    listing = browser.get("/ray/training/").content.decode()
    assert "#1 in queue" in listing


def test_tune_experiments_share_the_queue(owner, workspace, one_slot):
    job(owner, workspace, one_slot, "blocker")
    experiment = services.tune_experiment_create(
        actor=owner,
        workspace=workspace,
        ray_cluster=one_slot,
        name="sweep",
        search_space={"x": {"type": "uniform", "lower": 0, "upper": 1}},
        max_concurrent_trials=1,
        priority=80,
    )
    later = job(owner, workspace, one_slot, "later", priority=80)
    assert experiment.submitted_at is None
    assert experiment.queue_reason.startswith("First in the queue")
    positions = selectors.queue_positions(one_slot.pk)
    assert (positions[experiment.pk], positions[later.pk]) == (1, 2)


def test_cancel_a_queued_job_moves_the_others_up(owner, workspace, one_slot):
    job(owner, workspace, one_slot, "blocker")
    a = job(owner, workspace, one_slot, "a", priority=60)
    b = job(owner, workspace, one_slot, "b", priority=40)
    services.training_job_cancel(actor=owner, job=a)
    a.refresh_from_db()
    assert a.status == JobStatus.CANCELLED
    assert not Command.objects.filter(command_type="ray.job.stop", payload__submission_id=a.submission_id).exists()
    assert selectors.queue_positions(one_slot.pk) == {b.pk: 1}


def test_a_job_queued_past_its_timeout_fails_with_that_reason(owner, workspace, one_slot):
    job(owner, workspace, one_slot, "blocker")
    waiting = job(owner, workspace, one_slot, "waiting", queue_timeout_s=60)
    patient = job(owner, workspace, one_slot, "patient")
    assert services.queue_expire(now=timezone.now() + dt.timedelta(seconds=30)) == 0
    assert services.queue_expire(now=timezone.now() + dt.timedelta(seconds=61)) == 1
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.FAILED
    assert waiting.failure_reason.startswith("Waited in the queue longer than its queue_timeout of 60 s (First in")
    assert waiting.queue_reason == ""
    patient.refresh_from_db()
    assert patient.status == JobStatus.QUEUED


def test_a_cluster_that_is_not_running_queues_with_that_reason(owner, workspace, compute, add_node, make_ray):
    add_node(compute, "box-1")
    cluster = make_ray(runtime="process", max_workers=0)
    row = job(owner, workspace, cluster, "early")
    assert row.submitted_at is None
    assert row.queue_reason == "Waiting for Ray cluster train to run (it is pending)."
    start_head(cluster)  # the head's start result is the event; here the beat's pass dispatches
    assert services.workloads_poll() >= 1
    assert submitted("early")
