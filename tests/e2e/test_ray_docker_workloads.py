"""Train → Tune → Serve inside Ray containers: the docker runtime's workloads end to end on real Podman.

One agent runs the head container (Ray 2.9.0, the image `.ci/ray-image` builds) on Podman's Docker API.
Every workload takes the product's path: the control plane's services dispatch, Celery and the node's
tunnel carry the commands, and the agent submits each as a Ray job with its own Ray's Job client (2.60)
to the 2.9.0 head's dashboard, working_dir upload included; the programs run with the container's Ray.
The Serve deployment answers through the control plane's proxy on its own origin.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token

from agent.ray.commands import member_name
from agent.ray.ports import free_port
from fleet.models import Node
from raymgr import services as ray_services
from raymgr.models import RayCluster, RayNode
from raymgr.workloads import services
from raymgr.workloads.models import JobStatus, ServeDeployment, ServeStatus, TrainingJob, TuneExperiment
from tests.support.node_container import podman
from tests.support.processes import wait_until
from tests.support.ray_docker import VERSION, containers_of, ray_errors
from tests.support.ray_workloads import poll_workloads_until, serve_answer

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Records the Ray it ran with: the checkpoint (served below) proves the job ran in the container.
TRAIN = """
import json, os
import ray
import ctfleet

path = ctfleet.checkpoint_dir("final")
with open(os.path.join(path, "model.json"), "w") as f:
    json.dump({"trained": True, "ray": ray.__version__, "config": ctfleet.config()}, f)
ctfleet.report_checkpoint(path, loss=0.1)
"""


@pytest.mark.timeout(1500)
def test_train_tune_serve_run_inside_ray_containers(control_plane, cluster, operator, agents, docker_env):
    env, made = docker_env
    user, workspace = operator
    agents(control_plane, cluster, user, "ray-work", extra_env=env)
    wait_until(lambda: Node.objects.filter(cluster=cluster, status="online").exists(), timeout=60, what="online")
    ray = ray_services.ray_cluster_create(
        actor=user,
        workspace=workspace,
        compute_cluster=cluster,
        name="rc-work",
        runtime="docker",
        max_workers=0,
        gcs_port=free_port(),
        dashboard_port=free_port(),
    )
    made.append(str(ray.pk))
    assert ray.ray_version == VERSION
    wait_until(
        lambda: RayCluster.objects.get(pk=ray.pk).status in ("running", "failed"), timeout=400, interval=1, what="head"
    )
    ray = RayCluster.objects.get(pk=ray.pk)
    assert ray.status == "running", ray.failure_reason
    head = member_name(str(RayNode.objects.get(ray_cluster=ray, role="head").pk))
    timings: dict[str, float] = {}

    # A training job: a script with the ctfleet helper, its checkpoint written in the head container.
    started = time.monotonic()
    job = services.training_job_create(
        actor=user, workspace=workspace, ray_cluster=ray, name="train", script=TRAIN, config={"lr": 0.01}
    )
    poll_workloads_until(
        lambda: TrainingJob.objects.get(pk=job.pk).status not in JobStatus.active(), "training job done", timeout=300
    )
    timings["training job submitted → succeeded"] = time.monotonic() - started
    job = TrainingJob.objects.get(pk=job.pk)
    assert job.status == JobStatus.SUCCEEDED, (job.failure_reason or job.traceback or job.logs[-2000:]) + ray_errors(
        head
    )
    written = podman("exec", head, "cat", f"{job.latest_checkpoint}/model.json", check=False)
    assert json.loads(written.stdout) == {"trained": True, "ray": VERSION, "config": {"lr": 0.01}}, written.stderr
    assert not Path(job.latest_checkpoint, "model.json").exists()  # in the container, not on the agent's host

    # A Tune experiment: 2 trials of the built-in objective (best where x = 3), ASHA.
    started = time.monotonic()
    experiment = services.tune_experiment_create(
        actor=user,
        workspace=workspace,
        ray_cluster=ray,
        name="sweep",
        search_space={"x": {"type": "grid", "values": [1.0, 2.5]}},
        metric="score",
        mode="max",
        num_samples=1,
        max_concurrent_trials=2,
        max_iterations=3,
        scheduler="asha",
        cpus_per_trial=0.5,
    )
    poll_workloads_until(
        lambda: TuneExperiment.objects.get(pk=experiment.pk).status not in JobStatus.active(),
        "Tune experiment done",
        timeout=300,
    )
    timings["Tune (2 trials) submitted → succeeded"] = time.monotonic() - started
    experiment = TuneExperiment.objects.get(pk=experiment.pk)
    assert experiment.status == JobStatus.SUCCEEDED, (experiment.traceback or experiment.logs[-3000:]) + ray_errors(
        head
    )
    assert experiment.best_config == {"x": 2.5}
    trials = list(experiment.trials.all())
    assert len(trials) == 2
    assert {t.status for t in trials} == {"TERMINATED"}
    assert all(t.iterations >= 1 for t in trials)

    # A Serve deployment of the job's checkpoint, answering through the proxy (Serve's port is on the host
    # network of the head's node, reached through that node's tunnel).
    started = time.monotonic()
    deployment = services.serve_deployment_create(
        actor=user,
        workspace=workspace,
        ray_cluster=ray,
        name="served",
        checkpoint_job=job,
        http_port=free_port(),
        cpus_per_replica=0.25,
    )
    poll_workloads_until(
        lambda: (
            ServeDeployment.objects.get(pk=deployment.pk).status
            in (ServeStatus.RUNNING, ServeStatus.FAILED, ServeStatus.UNHEALTHY)
        ),
        "Serve deployment running",
        timeout=300,
    )
    deployment = ServeDeployment.objects.get(pk=deployment.pk)
    assert deployment.status == ServeStatus.RUNNING, deployment.failure_reason + ray_errors(head)
    token = Token.objects.create(user=user)
    body = serve_answer(control_plane, deployment, token.key, {"prompt": "hi container"}).json()
    timings["Serve deployed → first answer through the proxy"] = time.monotonic() - started
    assert body["input"] == {"prompt": "hi container"}
    assert body["checkpoint"] == job.latest_checkpoint
    assert body["model"]["model.json"] == {"trained": True, "ray": VERSION, "config": {"lr": 0.01}}
    print("\n" + "; ".join(f"{what} in {seconds:.0f} s" for what, seconds in timings.items()))

    # Delete → the head container and everything in it (Serve included) are gone.
    ray_services.ray_cluster_delete(actor=user, cluster=RayCluster.objects.get(pk=ray.pk))
    wait_until(lambda: not RayCluster.objects.filter(pk=ray.pk).exists(), timeout=180, what="cluster deleted")
    assert containers_of(ray.pk) == []
