"""Ray workload pages: dashboard cards (counts, htmx refresh, links), Training / Tune / Serving pages."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from raymgr.models import RayCluster
from raymgr.workloads import services
from raymgr.workloads.models import ServeDeployment, TrainingJob, TuneExperiment, TuneTrial
from tests.raymgr.conftest import confirm_submissions, finish, last_command, start_head

pytestmark = pytest.mark.django_db
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


def count(page: str, key: str) -> str:
    match = re.search(rf'data-count="{key}">([^<]*)<', page)
    assert match, key
    return match.group(1).strip()


def _job(owner, workspace, cluster, name, status):
    job = services.training_job_create(actor=owner, workspace=workspace, ray_cluster=cluster, name=name, script=SCRIPT)
    TrainingJob.objects.filter(pk=job.pk).update(status=status)
    return job


def test_dashboard_cards_count_and_refresh(browser, owner, workspace, running, make_ray, other_workspace):
    stopped = make_ray(name="idle", gcs_port=6391, dashboard_port=8267)
    RayCluster.objects.filter(pk=stopped.pk).update(status="stopped")
    for name, status in [("a", "running"), ("b", "running"), ("c", "succeeded"), ("d", "failed"), ("e", "queued")]:
        _job(owner, workspace, running, name, status)
    for name, status in [("s1", "running"), ("s2", "degraded"), ("s3", "unhealthy"), ("s4", "running")]:
        d = services.serve_deployment_create(
            actor=owner, workspace=workspace, ray_cluster=running, name=name, route_prefix=f"/{name}"
        )
        ServeDeployment.objects.filter(pk=d.pk).update(status=status)
    exp = services.tune_experiment_create(
        actor=owner,
        workspace=workspace,
        ray_cluster=running,
        name="sweep",
        search_space={"x": {"type": "constant", "value": 1}},
    )
    TuneExperiment.objects.filter(pk=exp.pk).update(status="running")
    TuneTrial.objects.create(experiment=exp, trial_id="t1", status="TERMINATED")
    TuneTrial.objects.create(experiment=exp, trial_id="t2", status="RUNNING")
    # Another workspace's rows are not counted.
    other_owner = other_workspace.memberships.get(role="owner").user
    RayCluster.objects.create(
        workspace=other_workspace, compute_cluster=running.compute_cluster, name="x", created_by=other_owner
    )

    page = browser.get("/ray/").content.decode()
    assert 'hx-trigger="every 30s"' in page
    assert 'hx-get="/ray/cards/"' in page
    assert count(page, "clusters-total") == "2"
    assert 'title="1 running, 1 stopped"' in page
    assert count(page, "deployments-running") == "2 running"
    assert count(page, "deployments-degraded") == "1 degraded"
    assert count(page, "deployments-unhealthy") == "1 unhealthy"
    assert count(page, "jobs-running") == "2 running"
    assert count(page, "jobs-completed") == "1 completed"
    assert count(page, "jobs-failed") == "1 failed"
    assert count(page, "tune-running") == "1 running"
    assert count(page, "tune-trials") == "1 / 2 trials done"
    for url in ("/ray/clusters/", "/ray/serving/", "/ray/training/", "/ray/tune/"):
        assert f'href="{url}"' in page
    partial = browser.get("/ray/cards/", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial
    assert count(partial, "jobs-failed") == "1 failed"


def test_training_pages_create_detail_cancel(browser, workspace, running):
    page = browser.get("/ray/training/new/").content.decode()
    assert "train (Acme, running)" in page
    form = {
        "name": "first",
        "ray_cluster": str(running.pk),
        "kind": "script",
        "script": SCRIPT,
        "framework": "none",
        "config": '{"lr": 0.1}',
        "num_workers": "1",
        "cpus_per_worker": "1",
        "gpus_per_worker": "0",
        "checkpoint_every": "1",
        "checkpoints_to_keep": "2",
    }
    response = browser.post("/ray/training/new/", form)
    assert response.status_code == 302
    job = TrainingJob.objects.get(name="first")
    assert job.config == {"lr": 0.1}
    assert last_command("ray.job.submit").payload["files"]["train.py"] == SCRIPT
    bad = browser.post("/ray/training/new/", {**form, "name": "second", "kind": "finetune", "framework": "deepspeed"})
    assert bad.status_code == 200
    assert "needs at least one GPU per worker" in bad.content.decode()
    TrainingJob.objects.filter(pk=job.pk).update(
        status="failed",
        traceback="Traceback (most recent call last):\nValueError: boom",
        checkpoints=[{"path": "/ck/1", "metrics": {}}],
    )
    detail = browser.get(f"/ray/training/{job.pk}/").content.decode()
    assert "ValueError: boom" in detail
    assert "/ck/1" in detail
    assert f"/ray/serving/new/?checkpoint_job={job.pk}" in detail
    assert "/ray/training/" in browser.get("/ray/training/").content.decode()
    assert browser.post(f"/ray/training/{job.pk}/cancel/", HTTP_HX_REQUEST="true").status_code == 409


def test_tune_detail_trials_and_train_with_best(browser, owner, workspace, running):
    exp = services.tune_experiment_create(
        actor=owner,
        workspace=workspace,
        ray_cluster=running,
        name="sweep",
        search_space={"x": {"type": "uniform", "lower": 0, "upper": 5}},
        max_iterations=4,
        training_script=SCRIPT,
    )
    TuneTrial.objects.create(experiment=exp, trial_id="t_00001", status="RUNNING", iterations=2, metric_value=-1.5)
    page = browser.get(f"/ray/tune/{exp.pk}/").content.decode()
    assert "t_00001" in page
    assert '<progress max="4" value="2">' in page
    assert "Train with best config" not in page
    TuneExperiment.objects.filter(pk=exp.pk).update(status="succeeded", best_config={"x": 3.0})
    page = browser.get(f"/ray/tune/{exp.pk}/").content.decode()
    assert "Train with best config" in page
    response = browser.post(f"/ray/tune/{exp.pk}/train/", {"name": "best-run"})
    job = TrainingJob.objects.get(name="best-run")
    assert response.url == f"/ray/training/{job.pk}/"
    assert job.config == {"x": 3.0}


def test_serve_pages(browser, owner, workspace, running):
    job = _job(owner, workspace, running, "trained", "succeeded")
    TrainingJob.objects.filter(pk=job.pk).update(checkpoints=[{"path": "/ck/final"}])
    page = browser.get(f"/ray/serving/new/?checkpoint_job={job.pk}").content.decode()
    assert f'<option value="{job.pk}" selected>' in page
    form = {
        "name": "svc",
        "ray_cluster": str(running.pk),
        "engine": "python",
        "checkpoint_job": str(job.pk),
        "http_port": "8000",
        "num_replicas": "1",
        "min_replicas": "1",
        "max_replicas": "1",
        "target_ongoing_requests": "2",
        "cpus_per_replica": "1",
        "gpus_per_replica": "0",
    }
    assert browser.post("/ray/serving/new/", form).status_code == 302
    deployment = ServeDeployment.objects.get(name="svc")
    assert deployment.checkpoint_path == "/ck/final"
    ServeDeployment.objects.filter(pk=deployment.pk).update(
        status="running", endpoint_url="http://10.0.0.1:8000/svc", replica_logs={"r1": "ready to serve"}
    )
    detail = browser.get(f"/ray/serving/{deployment.pk}/").content.decode()
    assert "http://10.0.0.1:8000/svc" in detail
    assert "ready to serve" in detail
    assert "svc" in browser.get("/ray/serving/").content.decode()


def test_viewer_cannot_create_and_strangers_get_404(owner, workspace, other_workspace, running, member_of):
    viewer = Client()
    viewer.force_login(member_of(workspace, "viewer"))
    assert viewer.post("/ray/training/new/", {"name": "x"}).status_code == 403
    job = _job(owner, workspace, running, "mine", "running")
    assert viewer.get(f"/ray/training/{job.pk}/").status_code == 200
    assert "Cancel" not in viewer.get(f"/ray/training/{job.pk}/").content.decode()
    stranger = Client()
    stranger.force_login(other_workspace.memberships.get(role="owner").user)
    assert stranger.get(f"/ray/training/{job.pk}/").status_code == 404
    assert stranger.post(f"/ray/training/{job.pk}/cancel/").status_code == 404


def test_serve_proxy_resolver_decisions(owner, workspace, running, other_workspace, member_of):
    from rest_framework.authtoken.models import Token

    from fleet import origin_names
    from fleet.proxy.resolvers import ProxyRefusal, ProxyTarget
    from raymgr.workloads.serve_proxy import SERVE_PATH, decide

    deployment = services.serve_deployment_create(
        actor=owner, workspace=workspace, ray_cluster=running, name="svc", http_port=8123
    )
    match = SERVE_PATH.match(f"{deployment.proxy_path}v1/chat")
    assert (match["id"], match["rest"]) == (str(deployment.pk), "/v1/chat")

    def scope(user=None, query=b"", path="/"):
        headers = [(b"host", origin_names.SERVE.host(deployment.pk).encode())]
        if user is not None:
            headers.append((b"authorization", f"Token {Token.objects.get_or_create(user=user)[0].key}".encode()))
        return {"type": "http", "path": path, "headers": headers, "query_string": query}

    refused = decide(scope(), str(deployment.pk))
    assert isinstance(refused, ProxyRefusal)
    assert refused.status == 401
    assert decide(scope(owner), str(deployment.pk)).status == 503  # still deploying
    ServeDeployment.objects.filter(pk=deployment.pk).update(status="running", last_status={"http_port": 8124})
    target = decide(scope(member_of(workspace, "viewer"), b"a=1", "/v1/chat"), str(deployment.pk))
    assert isinstance(target, ProxyTarget)
    assert (target.node_id, target.port, target.path) == (running.head_node_id, 8124, "/svc/v1/chat?a=1")
    stranger = other_workspace.memberships.get(role="owner").user
    assert decide(scope(stranger), str(deployment.pk)).status == 404


def test_a_succeeded_job_never_reads_queued(browser, owner, workspace, running):
    """Ray held the job PENDING ("Job has not started yet"), then it succeeded: the page (detail and list) and
    the API say what *Succeeded* means, never the reason it once waited for (one place: JobStatus.sentence)."""
    job = _job(owner, workspace, running, "done", "queued")
    confirm_submissions()
    services.workloads_poll()
    finish(
        last_command("ray.job.status"),
        data={"status": "PENDING", "message": "Job has not started yet.", "logs": "", "markers": []},
    )
    detail = browser.get(f"/ray/training/{job.pk}/").content.decode()
    assert "Queued: Ray has the job pending: Job has not started yet." in detail
    services.workloads_poll()
    finish(last_command("ray.job.status"), data={"status": "SUCCEEDED", "logs": "done", "markers": []})
    job.refresh_from_db()
    assert (job.status, job.queue_reason) == ("succeeded", "")
    for page in (browser.get(f"/ray/training/{job.pk}/").content.decode(), browser.get("/ray/training/").content):
        page = page if isinstance(page, str) else page.decode()
        assert ">Succeeded</span>" in page
        assert "Queued" not in page
        assert "not started" not in page
    assert "Succeeded: the Ray job finished without error." in browser.get(f"/ray/training/{job.pk}/").content.decode()
    api = browser.get(f"/api/v1/ray/training-jobs/{job.pk}/").json()
    assert api["status_sentence"] == "Succeeded: the Ray job finished without error."
    # a row left from before the fix (reason still stored) reads the same
    TrainingJob.objects.filter(pk=job.pk).update(queue_reason="Ray has the job pending: Job has not started yet.")
    assert "not started" not in browser.get(f"/ray/training/{job.pk}/").content.decode()
