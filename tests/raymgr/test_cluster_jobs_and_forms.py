"""Issue 35, Ray pages: the cluster's Jobs tab lists its workloads live; workload forms preselect a running
cluster and explain the training script; workload logs read clean."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from raymgr.models import RayCluster
from raymgr.workloads import services
from raymgr.workloads.models import ServeDeployment, TrainingJob, TuneExperiment
from tests.raymgr.conftest import start_head

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}
SCRIPT = "print('hi')\n"


@pytest.fixture
def browser(owner) -> Client:
    client = Client()
    client.force_login(owner)
    return client


@pytest.fixture
def running(compute, add_node, make_ray):
    add_node(compute, "box-1")
    cluster = make_ray(runtime="process", max_workers=0)
    start_head(cluster)
    return cluster


def _rows(page: str) -> list[tuple[str, str]]:
    """(kind, status) of each row of the Jobs tab's workload table, in order."""
    return re.findall(r'<tr data-kind="([^"]+)" data-status="([^"]+)"', page)


def test_jobs_tab_lists_the_clusters_training_tune_and_serve_with_status_live(browser, owner, workspace, running):
    url = f"/ray/clusters/{running.pk}/?tab=jobs"
    empty = browser.get(url).content.decode()
    assert "No training jobs, Tune experiments or Serve deployments on this cluster yet" in empty
    assert 'id="ray-jobs" data-live="settled"' in empty

    job = services.training_job_create(actor=owner, workspace=workspace, ray_cluster=running, name="ft", script=SCRIPT)
    TrainingJob.objects.filter(pk=job.pk).update(status="running", submission_id="train-abc")
    done = services.training_job_create(
        actor=owner, workspace=workspace, ray_cluster=running, name="old", script=SCRIPT
    )
    TrainingJob.objects.filter(pk=done.pk).update(status="succeeded", submission_id="train-old")
    deployment = services.serve_deployment_create(
        actor=owner, workspace=workspace, ray_cluster=running, name="llm", route_prefix="/llm"
    )
    ServeDeployment.objects.filter(pk=deployment.pk).update(status="running", submission_id="serve-llm")
    experiment = services.tune_experiment_create(
        actor=owner,
        workspace=workspace,
        ray_cluster=running,
        name="sweep",
        search_space={"x": {"type": "constant", "value": 1}},
    )
    TuneExperiment.objects.filter(pk=experiment.pk).update(status="running", submission_id="tune-sweep")
    # another cluster's job is not this cluster's
    other = RayCluster.objects.create(
        workspace=workspace, compute_cluster=running.compute_cluster, name="other", created_by=owner
    )
    services.training_job_create(actor=owner, workspace=workspace, ray_cluster=other, name="elsewhere", script=SCRIPT)

    page = browser.get(url).content.decode()
    assert "No jobs reported by the head" not in page
    rows = _rows(page)
    assert sorted(rows[:3]) == [
        ("Serve deployment", "running"),
        ("Training job", "running"),
        ("Tune experiment", "running"),
    ]
    assert rows[3:] == [("Training job", "succeeded")]  # finished ones after the active ones
    for name, path in (("ft", f"/ray/training/{job.pk}/"), ("llm", f"/ray/serving/{deployment.pk}/")):
        assert f'<a href="{path}">{name}</a>' in page
    assert f'<a href="/ray/tune/{experiment.pk}/">sweep</a>' in page
    for submission in ("train-abc", "serve-llm", "tune-sweep"):
        assert f"<code>{submission}</code>" in page
    assert "elsewhere" not in page
    assert 'id="ray-jobs" hx-get="?tab=jobs" hx-trigger="every 3s"' in page  # a job runs: it polls

    # the poll brings the tab's new state, without a reload
    TrainingJob.objects.filter(pk=job.pk).update(status="failed")
    TuneExperiment.objects.filter(pk=experiment.pk).update(status="succeeded")
    poll = browser.get(url, HTTP_HX_TRIGGER="ray-jobs", **HX)
    body = poll.content.decode()
    assert poll.status_code == 200
    assert "<html" not in body
    assert _rows(body)[0] == ("Serve deployment", "running")
    assert ("Training job", "failed") in _rows(body)
    assert 'hx-trigger="every 30s"' in body  # only a serving deployment left: watched, slower

    ServeDeployment.objects.filter(pk=deployment.pk).update(status="stopped")
    settled = browser.get(url, HTTP_HX_TRIGGER="ray-jobs", **HX)
    assert settled.status_code == 286  # nothing active: polling stops
    assert 'data-live="settled"' in settled.content.decode()


def test_jobs_tab_also_shows_other_ray_jobs_the_head_reported(browser, owner, workspace, running):
    job = services.training_job_create(actor=owner, workspace=workspace, ray_cluster=running, name="ft", script=SCRIPT)
    TrainingJob.objects.filter(pk=job.pk).update(status="running", submission_id="train-abc")
    RayCluster.objects.filter(pk=running.pk).update(
        last_status={
            "jobs": [
                {"submission_id": "train-abc", "status": "RUNNING", "entrypoint": "python train.py"},
                {"submission_id": "raysubmit_1", "status": "SUCCEEDED", "entrypoint": "python mine.py"},
            ]
        }
    )
    page = browser.get(f"/ray/clusters/{running.pk}/?tab=jobs").content.decode()
    assert "Other Ray jobs on the head" in page
    assert "raysubmit_1" in page
    assert "python mine.py" in page
    assert page.count("train-abc") == 1  # ours is listed once, as our workload


def _selected(page: str) -> str | None:
    select = re.search(r'<select name="ray_cluster".*?</select>', page, re.S)
    assert select, page
    chosen = re.search(r'<option value="([^"]*)"[^>]*selected', select.group(0))
    return chosen.group(1) if chosen else None


def _options(page: str) -> list[str]:
    select = re.search(r'<select name="ray_cluster".*?</select>', page, re.S).group(0)
    return [label.strip() for label in re.findall(r"<option[^>]*>([^<]*)</option>", select)]


@pytest.mark.parametrize("path", ["/ray/training/new/", "/ray/tune/new/", "/ray/serving/new/"])
def test_workload_forms_preselect_a_running_cluster_and_list_failed_ones_last(
    browser, owner, workspace, compute, running, path
):
    failed = RayCluster.objects.create(
        workspace=workspace, compute_cluster=compute, name="broken", created_by=owner, status="failed"
    )
    RayCluster.objects.create(
        workspace=workspace, compute_cluster=compute, name="aaa", created_by=owner, status="stopped"
    )
    page = browser.get(path).content.decode()
    assert _selected(page) == str(running.pk)
    assert _options(page) == [
        "— choose a Ray cluster —",
        "train (Acme, running)",
        "aaa (Acme, stopped)",
        "broken (Acme, failed: start it again first)",
    ]
    # a cluster asked for in the link wins
    assert _selected(browser.get(f"{path}?ray_cluster={failed.pk}").content.decode()) == str(failed.pk)
    # with no running cluster, none is preselected
    RayCluster.objects.filter(pk=running.pk).update(status="failed")
    assert _selected(browser.get(path).content.decode()) == ""  # the "choose" option


def test_training_script_box_has_an_example_and_help(browser, running):
    page = browser.get("/ray/training/new/").content.decode()
    box = re.search(r'<textarea name="script"[^>]*>', page).group(0)
    assert 'placeholder="import ctfleet' in box
    assert "ctfleet.report_checkpoint(path, loss=loss)" in box
    assert "Python run on the Ray cluster as train.py" in page
    assert "its page shows the Python traceback" in page


LOG = (
    "\x1b[36m(pid=7)\x1b[0m Trial t_00000 started\n"
    '\x1b[36m(Trainable pid=8)\x1b[0m CTFLEET {"kind": "trial", "trial_id": "t_00000"}\n'
    'CTFLEET {"kind": "best", "config": {"x": 1}}\n'
    "\x1b[1m== Status ==\x1b[0m\n"
)


def test_workload_logs_show_no_escape_codes_or_marker_lines(browser, owner, workspace, running):
    experiment = services.tune_experiment_create(
        actor=owner,
        workspace=workspace,
        ray_cluster=running,
        name="sweep",
        search_space={"x": {"type": "constant", "value": 1}},
    )
    TuneExperiment.objects.filter(pk=experiment.pk).update(logs=LOG)
    job = services.training_job_create(actor=owner, workspace=workspace, ray_cluster=running, name="ft", script=SCRIPT)
    TrainingJob.objects.filter(pk=job.pk).update(logs=LOG)
    for path in (f"/ray/tune/{experiment.pk}/", f"/ray/training/{job.pk}/"):
        for headers in ({}, {"HTTP_HX_TRIGGER": "workload-live", **HX}):
            page = browser.get(path, **headers).content.decode()
            logs = re.search(r'<pre class="logs">(.*?)</pre>', page, re.S).group(1)
            assert logs == "(pid=7) Trial t_00000 started\n== Status ==\n", path
            assert "\x1b" not in page
            assert "CTFLEET" not in page
