"""The Ray workloads API: create/list/inspect, 400 field errors, 403 for Viewers, 404 across workspaces, 409."""

from __future__ import annotations

import pytest

from fleet.models import Command
from raymgr.workloads.models import TuneExperiment
from tests.raymgr.conftest import confirm_submissions, finish, last_command, start_head

pytestmark = pytest.mark.django_db

API = "/api/v1/ray/"
SCRIPT = "print('hi')\n"


@pytest.fixture
def running(compute, add_node, make_ray):
    add_node(compute, "box-1")
    cluster = make_ray(runtime="process", max_workers=0)
    start_head(cluster)
    return cluster


def body(workspace, cluster, **extra):
    return {"workspace": str(workspace.pk), "ray_cluster": str(cluster.pk), "name": "job-1", **extra}


def test_training_job_create_read_cancel(api_client_for, owner, workspace, running):
    client = api_client_for(owner)
    response = client.post(f"{API}training-jobs/", body(workspace, running, script=SCRIPT), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["status"] == "queued"
    assert data["submission_id"] == f"train-{data['id']}"
    assert data["hints"] == []
    assert last_command("ray.job.submit").payload["files"]["train.py"] == SCRIPT
    listed = client.get(f"{API}training-jobs/", {"status": "queued"}).json()
    assert [row["id"] for row in listed["results"]] == [data["id"]]
    response = client.post(f"{API}training-jobs/{data['id']}/cancel/")
    assert response.status_code == 200
    assert last_command("ray.job.stop").payload["submission_id"] == data["submission_id"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"script": ""}, "script"),
        ({"num_workers": "many"}, "num_workers"),
        ({"kind": "finetune", "framework": "deepspeed", "config": {"model": "m", "dataset": "d"}}, "gpus_per_worker"),
        ({"config": [1]}, "config"),
    ],
)
def test_training_job_400(api_client_for, owner, workspace, running, extra, field):
    extra.setdefault("script", SCRIPT)
    response = api_client_for(owner).post(f"{API}training-jobs/", body(workspace, running, **extra), format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_viewer_gets_403_and_other_workspace_404(api_client_for, owner, workspace, other_workspace, running, member_of):
    viewer = api_client_for(member_of(workspace, "viewer"))
    response = viewer.post(f"{API}training-jobs/", body(workspace, running, script=SCRIPT), format="json")
    assert response.status_code == 403
    created = api_client_for(owner).post(f"{API}training-jobs/", body(workspace, running, script=SCRIPT), format="json")
    job_id = created.json()["id"]
    assert viewer.get(f"{API}training-jobs/{job_id}/").status_code == 200
    assert viewer.post(f"{API}training-jobs/{job_id}/cancel/").status_code == 403
    stranger = api_client_for(other_workspace.memberships.get(role="owner").user)
    assert stranger.get(f"{API}training-jobs/{job_id}/").status_code == 404
    assert stranger.post(f"{API}training-jobs/{job_id}/cancel/").status_code == 404
    # Someone else's Ray cluster named from one's own workspace: 400 on the field.
    response = stranger.post(f"{API}training-jobs/", body(other_workspace, running, script=SCRIPT), format="json")
    assert response.status_code == 400
    assert "ray_cluster" in response.json()
    # A workspace one is not in: 404.
    response = stranger.post(f"{API}training-jobs/", body(workspace, running, script=SCRIPT), format="json")
    assert response.status_code == 404


def test_finished_job_cancel_is_409(api_client_for, owner, workspace, running):
    client = api_client_for(owner)
    job_id = client.post(f"{API}training-jobs/", body(workspace, running, script=SCRIPT), format="json").json()["id"]
    from raymgr.workloads import services

    confirm_submissions()

    services.workloads_poll()
    finish(last_command("ray.job.status"), data={"status": "SUCCEEDED"})
    response = client.post(f"{API}training-jobs/{job_id}/cancel/")
    assert response.status_code == 409


def test_tune_experiment_and_train_with_best(api_client_for, owner, workspace, running):
    client = api_client_for(owner)
    space = {"lr": {"type": "loguniform", "lower": 0.001, "upper": 0.1}}
    payload = body(workspace, running, name="sweep", search_space=space, scheduler="pbt", training_script=SCRIPT)
    response = client.post(f"{API}tune-experiments/", payload, format="json")
    assert response.status_code == 201, response.content
    exp_id = response.json()["id"]
    assert response.json()["trials"] == []
    response = client.post(f"{API}tune-experiments/{exp_id}/train/", {"name": "best"}, format="json")
    assert response.status_code == 409  # no best config yet
    TuneExperiment.objects.filter(pk=exp_id).update(status="succeeded", best_config={"lr": 0.01})
    response = client.post(f"{API}tune-experiments/{exp_id}/train/", {"name": "best"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["config"] == {"lr": 0.01}
    assert response.json()["source_experiment"] == exp_id
    bad = client.post(
        f"{API}tune-experiments/", body(workspace, running, name="x", search_space={"a": 1}), format="json"
    )
    assert bad.status_code == 400
    assert "search_space" in bad.json()


def test_deployment_create_and_stop(api_client_for, owner, workspace, running):
    client = api_client_for(owner)
    payload = body(workspace, running, name="svc", autoscaling=True, min_replicas=1, max_replicas=3)
    response = client.post(f"{API}deployments/", payload, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["status"], data["route_prefix"], data["autoscaling"]) == ("deploying", "/svc", True)
    assert Command.objects.filter(command_type="ray.job.submit", payload__submission_id=f"serve-{data['id']}").exists()
    response = client.post(f"{API}deployments/{data['id']}/stop/")
    assert response.status_code == 200
    assert response.json()["status"] == "stopping"
    assert client.post(f"{API}deployments/{data['id']}/stop/").status_code == 409
    bad = client.post(f"{API}deployments/", body(workspace, running, name="v", engine="vllm"), format="json")
    assert bad.status_code == 400
    assert "model" in bad.json()
    bad = client.post(
        f"{API}deployments/",
        body(workspace, running, name="v", checkpoint_job="00000000-0000-0000-0000-000000000000"),
        format="json",
    )
    assert bad.status_code == 400
    assert "checkpoint_job" in bad.json()
