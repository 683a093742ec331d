"""Ray workload services on the real database; head answers fed through fleet's command_record_* services."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from fleet.models import Command, CommandStatus
from kernel.exceptions import IllegalTransition
from raymgr.workloads import render, services
from raymgr.workloads.models import JobStatus, ServeStatus, TrainingJob, TuneTrial
from tests.raymgr.conftest import confirm_submissions, finish, last_command, start_head

pytestmark = pytest.mark.django_db

SCRIPT = "import ctfleet\nprint(ctfleet.config())\n"
SPACE = {"x": {"type": "uniform", "lower": 0, "upper": 5}}


@pytest.fixture
def running(compute, add_node, make_ray):
    add_node(compute, "box-1")
    cluster = make_ray(runtime="process", max_workers=0)
    start_head(cluster)
    assert cluster.status == "running"
    return cluster


def _job(owner, workspace, cluster, **kwargs):
    kwargs.setdefault("script", SCRIPT)
    return services.training_job_create(
        actor=owner, workspace=workspace, ray_cluster=cluster, name=kwargs.pop("name", "job-1"), **kwargs
    )


def test_script_job_is_submitted_to_the_head_with_its_files(owner, workspace, running):
    job = _job(owner, workspace, running, config={"lr": 0.1}, storage_path="/data/ckpt")
    command = last_command("ray.job.submit", submission_id=f"train-{job.pk}")
    assert command.node_id == running.head_node_id
    assert command.payload["member_id"] == str(running.ray_nodes.get(role="head").pk)
    assert command.payload["dashboard_port"] == running.dashboard_port
    assert command.payload["entrypoint"] == "python train.py"
    assert command.payload["files"]["train.py"] == SCRIPT
    spec = json.loads(command.payload["files"]["ctfleet_spec.json"])
    assert spec["config"] == {"lr": 0.1}
    assert spec["storage_path"] == "/data/ckpt"
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert job.submitted_at is not None
    assert job.queue_reason == ""


def test_job_status_results_move_the_state_and_record_checkpoints(owner, workspace, running):
    job = _job(owner, workspace, running)
    finish(last_command("ray.job.submit"), data={"submission_id": job.submission_id, "status": "PENDING"})
    assert services.workloads_poll() == 1
    status = last_command("ray.job.status", submission_id=job.submission_id)
    assert services.workloads_poll() == 0  # one status request in flight at a time
    finish(status, data={"status": "RUNNING", "logs": "epoch 1", "markers": []})
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert job.logs == "epoch 1"
    services.workloads_poll()
    markers = [{"kind": "checkpoint", "path": "/ck/1", "metrics": {"loss": 0.5}}]
    finish(
        last_command("ray.job.status", submission_id=job.submission_id),
        data={"status": "SUCCEEDED", "markers": markers},
    )
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert job.finished_at is not None
    assert job.checkpoints == [{"path": "/ck/1", "metrics": {"loss": 0.5}}]
    assert job.latest_checkpoint == "/ck/1"
    assert services.workloads_poll() == 0  # finished jobs are not polled


def test_failed_job_keeps_the_traceback(owner, workspace, running):
    job = _job(owner, workspace, running)
    confirm_submissions()
    services.workloads_poll()
    tb = 'Traceback (most recent call last):\n  File "train.py", line 1\nZeroDivisionError: division by zero'
    finish(last_command("ray.job.status"), data={"status": "FAILED", "message": "exit 1", "traceback": tb})
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.traceback.endswith("ZeroDivisionError: division by zero")
    assert job.failure_reason == "exit 1"
    with pytest.raises(IllegalTransition):
        services.training_job_cancel(actor=owner, job=job)


def test_job_needing_more_gpus_than_exist_queues_and_is_submitted_once_they_do(
    owner, workspace, compute, running, add_node
):
    job = _job(owner, workspace, running, gpus_per_worker=1, num_workers=2)
    assert job.status == JobStatus.QUEUED
    assert "Needs 2 GPUs" in job.queue_reason
    assert job.submitted_at is None
    assert not Command.objects.filter(command_type="ray.job.submit").exists()
    running.max_workers = 1
    running.save(update_fields=["max_workers"])
    add_node(compute, "gpu-box", gpus=2)
    services.workloads_poll()
    job.refresh_from_db()
    assert job.queue_reason == ""
    assert job.submitted_at is not None
    assert last_command("ray.job.submit").payload["entrypoint_num_gpus"] == 1


def test_job_on_a_stopped_cluster_waits(owner, workspace, make_ray, compute, add_node):
    add_node(compute, "box")
    cluster = make_ray(name="cold")  # pending: head not started
    job = _job(owner, workspace, cluster)
    assert job.status == JobStatus.QUEUED
    assert "to run" in job.queue_reason


def test_cancel_unsubmitted_and_submitted(owner, workspace, running, make_ray):
    job = _job(owner, workspace, running)
    cancelled = services.training_job_cancel(actor=owner, job=job)
    assert cancelled.cancel_requested
    assert cancelled.status == JobStatus.QUEUED
    stop = last_command("ray.job.stop", submission_id=job.submission_id)
    finish(stop, data={"stopped": True})
    confirm_submissions()
    services.workloads_poll()
    finish(last_command("ray.job.status"), data={"status": "STOPPED"})
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    waiting = _job(owner, workspace, make_ray(name="other", gcs_port=6390, dashboard_port=8266), name="job-2")
    assert services.training_job_cancel(actor=owner, job=waiting).status == JobStatus.CANCELLED


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"script": ""}, "script"),
        ({"script": "def f(:\n"}, "script"),
        ({"framework": "torch_ddp"}, "framework"),
        ({"kind": "finetune", "framework": "none", "config": {"model": "m", "dataset": "d"}}, "framework"),
        ({"kind": "finetune", "framework": "torch_ddp", "config": {}}, "config"),
        ({"kind": "finetune", "framework": "deepspeed", "config": {"model": "m", "dataset": "d"}}, "gpus_per_worker"),
        (
            {"kind": "finetune", "framework": "torch_ddp", "config": {"model": "m", "dataset": "d", "lora": {"r": 0}}},
            "config",
        ),
        ({"num_workers": 0}, "num_workers"),
        ({"name": "Bad Name"}, "name"),
    ],
)
def test_training_field_errors(owner, workspace, running, kwargs, field):
    with pytest.raises(ValidationError) as info:
        _job(owner, workspace, running, **kwargs)
    assert field in info.value.message_dict


def test_viewer_cannot_create_and_other_workspace_cluster_is_refused(
    owner, workspace, other_workspace, running, member_of
):
    viewer = member_of(workspace, "viewer")
    with pytest.raises(PermissionDenied):
        _job(viewer, workspace, running)
    other_owner = other_workspace.memberships.get(role="owner").user
    with pytest.raises(ValidationError) as info:
        _job(other_owner, other_workspace, running)
    assert "ray_cluster" in info.value.message_dict


def test_finetune_renders_torch_trainer_with_lora_and_scaling(owner, workspace, running, add_node, compute):
    running.max_workers = 2
    running.save(update_fields=["max_workers"])
    add_node(compute, "gpu-a", gpus=4)
    add_node(compute, "gpu-b", gpus=4)
    job = _job(
        owner,
        workspace,
        running,
        script="",
        kind="finetune",
        framework="deepspeed",
        num_workers=8,
        cpus_per_worker=2,
        gpus_per_worker=1,
        checkpoint_every=2,
        config={"model": "org/tiny", "dataset": "/data/t.txt", "lora": {"r": 8, "lora_alpha": 16}, "zero_stage": 3},
    )
    submission = render.training_submission(job)
    assert submission.entrypoint == "python finetune.py"
    compile(submission.files["finetune.py"], "finetune.py", "exec")
    assert "TorchTrainer" in submission.files["finetune.py"]
    assert "get_peft_model" in submission.files["finetune.py"]
    spec = submission.spec
    assert spec["scaling"] == {"num_workers": 8, "cpus_per_worker": 2.0, "gpus_per_worker": 1.0}
    assert spec["framework"] == "deepspeed"
    assert spec["config"]["deepspeed_config"]["zero_optimization"]["stage"] == 3
    assert spec["config"]["lora"] == {"r": 8, "lora_alpha": 16}
    assert spec["config"]["checkpoint_every"] == 2
    assert render.finetune_requirements(job) == ["torch", "transformers", "peft", "deepspeed"]
    # The trainer's workers reserve GPUs, not the driver.
    assert submission.entrypoint_num_gpus == 0
    assert last_command("ray.job.submit", submission_id=job.submission_id) is not None


def test_tune_experiment_trials_best_and_train_with_best(owner, workspace, running):
    experiment = services.tune_experiment_create(
        actor=owner,
        workspace=workspace,
        ray_cluster=running,
        name="sweep",
        search_space=SPACE,
        scheduler="asha",
        num_samples=2,
        training_script=SCRIPT,
    )
    submit = last_command("ray.job.submit", submission_id=f"tune-{experiment.pk}")
    spec = json.loads(submit.payload["files"]["ctfleet_spec.json"])
    assert (spec["scheduler"], spec["num_samples"], spec["search_space"]) == ("asha", 2, SPACE)
    with pytest.raises(IllegalTransition):
        services.tune_train_with_best(actor=owner, experiment=experiment, name="best")
    confirm_submissions()
    services.workloads_poll()
    markers = [
        {"kind": "trial", "trial_id": "t1", "status": "RUNNING", "config": {"x": 1.0}},
        {"kind": "trial", "trial_id": "t1", "status": "RUNNING", "config": {"x": 1.0}, "iteration": 3, "metric": -4.0},
        {"kind": "trial", "trial_id": "t2", "status": "TERMINATED", "config": {"x": 2.9}},
        {"kind": "trial", "trial_id": "t1", "status": "TERMINATED", "config": {"x": 1.0}},
        {"kind": "best", "config": {"x": 2.9}, "metrics": {"score": -0.1}},
    ]
    finish(last_command("ray.job.status"), data={"status": "SUCCEEDED", "markers": markers})
    experiment.refresh_from_db()
    assert experiment.status == JobStatus.SUCCEEDED
    assert experiment.best_config == {"x": 2.9}
    t1 = TuneTrial.objects.get(experiment=experiment, trial_id="t1")
    assert (t1.status, t1.iterations, t1.metric_value) == ("TERMINATED", 3, -4.0)
    assert experiment.trials.filter(status__in=("TERMINATED", "ERROR")).count() == 2
    job = services.tune_train_with_best(actor=owner, experiment=experiment, name="best")
    assert job.config == {"x": 2.9}
    assert job.source_experiment_id == experiment.pk
    assert json.loads(
        last_command("ray.job.submit", submission_id=job.submission_id).payload["files"]["ctfleet_spec.json"]
    )["config"] == {"x": 2.9}


def test_tune_experiment_pending_in_ray_records_its_status(owner, workspace, running):
    """Ray holds a fresh job PENDING while its runtime env is set up: the experiment stays queued, logs kept."""
    experiment = services.tune_experiment_create(
        actor=owner, workspace=workspace, ray_cluster=running, name="sweep", search_space=SPACE
    )
    confirm_submissions()
    services.workloads_poll()
    finish(last_command("ray.job.status"), data={"status": "PENDING", "logs": "setting up", "markers": []})
    experiment.refresh_from_db()
    assert (experiment.status, experiment.logs, experiment.last_status) == (
        JobStatus.QUEUED,
        "setting up",
        {"status": "PENDING"},
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"search_space": {}}, "search_space"),
        ({"search_space": {"x": {"type": "uniform", "lower": 5, "upper": 1}}}, "search_space"),
        ({"search_space": {"x": {"type": "loguniform", "lower": 0, "upper": 1}}}, "search_space"),
        ({"search_space": {"x": {"type": "grid", "values": [1]}}, "scheduler": "pbt"}, "scheduler"),
        ({"mode": "sideways"}, "mode"),
        ({"scheduler": "hyperband"}, "scheduler"),
        ({"objective_code": "x = 1"}, "objective_code"),
        ({"max_concurrent_trials": 0}, "max_concurrent_trials"),
    ],
)
def test_tune_field_errors(owner, workspace, running, kwargs, field):
    kwargs.setdefault("search_space", SPACE)
    with pytest.raises(ValidationError) as info:
        services.tune_experiment_create(actor=owner, workspace=workspace, ray_cluster=running, name="t", **kwargs)
    assert field in info.value.message_dict


def _serve(owner, workspace, cluster, **kwargs):
    return services.serve_deployment_create(
        actor=owner, workspace=workspace, ray_cluster=cluster, name=kwargs.pop("name", "svc"), **kwargs
    )


def test_serve_checkpoint_deploys_then_health_from_serve_status(owner, workspace, running):
    job = _job(owner, workspace, running)
    TrainingJob.objects.filter(pk=job.pk).update(status="succeeded", checkpoints=[{"path": "/ck/a"}, {"path": "/ck/b"}])
    job.refresh_from_db()
    deployment = _serve(owner, workspace, running, checkpoint_job=job, num_replicas=2, http_port=8123)
    assert deployment.status == ServeStatus.DEPLOYING
    assert deployment.route_prefix == "/svc"
    submit = last_command("ray.job.submit", submission_id=f"serve-{deployment.pk}")
    spec = json.loads(submit.payload["files"]["ctfleet_spec.json"])
    assert (spec["checkpoint_path"], spec["num_replicas"], spec["http_port"]) == ("/ck/b", 2, 8123)
    compile(submit.payload["files"]["serve_deploy.py"], "serve_deploy.py", "exec")
    confirm_submissions()
    services.workloads_poll()
    finish(last_command("ray.job.status", submission_id=deployment.submission_id), data={"status": "SUCCEEDED"})
    app = {
        "status": "RUNNING",
        "deployments": {"model": {"status": "HEALTHY", "target_num_replicas": 2, "replicas": [{"state": "RUNNING"}]}},
        "replica_logs": {"r1": "INFO ready"},
    }
    finish(last_command("ray.serve.status"), data={"applications": {"app-svc": app}, "http_port": 8123})
    deployment.refresh_from_db()
    assert deployment.status == ServeStatus.DEGRADED
    assert "1 of 2" in deployment.failure_reason
    assert deployment.endpoint_url == "http://10.0.0.1:8123/svc"
    assert deployment.replica_logs == {"r1": "INFO ready"}
    app["deployments"]["model"]["replicas"].append({"state": "RUNNING"})
    confirm_submissions()
    services.workloads_poll()
    finish(last_command("ray.serve.status"), data={"applications": {"app-svc": app}, "http_port": 8123})
    deployment.refresh_from_db()
    assert deployment.status == ServeStatus.RUNNING
    assert deployment.failure_reason == ""
    stopped = services.serve_deployment_stop(actor=owner, deployment=deployment)
    assert stopped.status == ServeStatus.STOPPING
    assert (
        json.loads(
            last_command("ray.job.submit", submission_id=stopped.submission_id).payload["files"]["ctfleet_spec.json"]
        )["action"]
        == "delete"
    )
    confirm_submissions()
    services.workloads_poll()
    finish(last_command("ray.job.status", submission_id=stopped.submission_id), data={"status": "SUCCEEDED"})
    deployment.refresh_from_db()
    assert deployment.status == ServeStatus.STOPPED
    assert deployment.endpoint_url == ""


def test_failed_deploy_job_shows_traceback(owner, workspace, running):
    deployment = _serve(owner, workspace, running, engine="vllm", model="org/llm")
    confirm_submissions()
    services.workloads_poll()
    tb = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'vllm'"
    finish(
        last_command("ray.job.status", submission_id=deployment.submission_id),
        data={"status": "FAILED", "traceback": tb},
    )
    deployment.refresh_from_db()
    assert deployment.status == ServeStatus.FAILED
    assert "vllm" in deployment.failure_reason


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"engine": "vllm"}, "model"),
        ({"engine": "tgi"}, "engine"),
        ({"autoscaling": True, "min_replicas": 3, "max_replicas": 2}, "max_replicas"),
        ({"route_prefix": "nope"}, "route_prefix"),
        ({"http_port": 0}, "http_port"),
        ({"code": "def (:"}, "code"),
    ],
)
def test_serve_field_errors(owner, workspace, running, kwargs, field):
    with pytest.raises(ValidationError) as info:
        _serve(owner, workspace, running, **kwargs)
    assert field in info.value.message_dict


def test_serve_refuses_a_job_without_checkpoints_and_duplicate_routes(owner, workspace, running):
    job = _job(owner, workspace, running)
    with pytest.raises(ValidationError) as info:
        _serve(owner, workspace, running, checkpoint_job=job)
    assert "checkpoint_job" in info.value.message_dict
    _serve(owner, workspace, running, route_prefix="/a")
    with pytest.raises(ValidationError) as info:
        _serve(owner, workspace, running, name="svc-2", route_prefix="/a")
    assert "route_prefix" in info.value.message_dict


def test_submit_failure_fails_the_job(owner, workspace, running):
    job = _job(owner, workspace, running)
    finish(last_command("ray.job.submit"), ok=False, code="not_found", message="no dashboard")
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert "no dashboard" in job.failure_reason
    assert Command.objects.get(command_type="ray.job.submit").status == CommandStatus.FAILED


def test_serve_deployments_on_one_cluster_share_its_serve_port(owner, workspace, running):
    _serve(owner, workspace, running, name="one", http_port=8200)
    with pytest.raises(ValidationError) as info:
        _serve(owner, workspace, running, name="two", http_port=8201)
    assert "port 8200" in info.value.message_dict["http_port"][0]
    assert _serve(owner, workspace, running, name="three", http_port=8200).status == ServeStatus.DEPLOYING


def test_vllm_deployment_renders_an_llm_config_with_autoscaling(owner, workspace, running):
    deployment = _serve(
        owner, workspace, running, engine="vllm", model="org/llm", autoscaling=True, min_replicas=1, max_replicas=4
    )
    spec = render.serve_submission(deployment).spec
    assert (spec["engine"], spec["model"], spec["app_name"]) == ("vllm", "org/llm", "app-svc")
    assert spec["deployment_config"] == {
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 2.0}
    }
    script = render.serve_submission(deployment).files["serve_deploy.py"]
    assert "build_openai_app" in script
    assert "LLMConfig" in script


def test_status_is_not_asked_before_the_head_confirms_the_submission(owner, workspace, running):
    job = _job(owner, workspace, running)
    assert services.workloads_poll() == 0  # the submit is still in flight: Ray may not know the job yet
    assert not Command.objects.filter(command_type="ray.job.status").exists()
    confirm_submissions()
    assert services.workloads_poll() == 1
    assert last_command("ray.job.status", submission_id=job.submission_id) is not None
