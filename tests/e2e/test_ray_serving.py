"""Train → serve → HTTP through the control plane, every hop real: a training job and a Serve deployment
on a managed Ray cluster run by a real agent, and the request reaches Serve through daphne and the
node's tunnel (the node accepts no inbound connection). Tune → train → serve with real Ray is covered in
tests/raymgr/test_real_ray_workloads.py; this test adds the tunnel, Celery and proxy hops.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from rest_framework.authtoken.models import Token

from agent.ray.ports import free_port
from fleet import origin_names
from fleet.models import Node
from raymgr import services as ray_services
from raymgr.models import RayCluster
from raymgr.workloads import services
from raymgr.workloads.models import JobStatus, ServeDeployment, ServeStatus, TrainingJob
from tests.support.processes import wait_until
from tests.support.ray_workloads import poll_workloads_until, serve_answer, serve_origin

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TRAIN = """
import json, os
import ctfleet

path = ctfleet.checkpoint_dir("final")
with open(os.path.join(path, "model.json"), "w") as f:
    json.dump({"trained": True, "config": ctfleet.config()}, f)
ctfleet.report_checkpoint(path, loss=0.1)
"""


@pytest.mark.timeout(600)
def test_train_then_serve_answers_through_the_tunnel(
    control_plane, cluster, operator, agents, tmp_path, no_leftover_ray
):
    user, workspace = operator
    agents(control_plane, cluster, user, "ray-serve")
    wait_until(lambda: Node.objects.filter(cluster=cluster, status="online").exists(), timeout=30, what="online")
    ray = ray_services.ray_cluster_create(
        actor=user,
        workspace=workspace,
        compute_cluster=cluster,
        name="serve-rc",
        runtime="process",
        max_workers=0,
        gcs_port=free_port(),
        dashboard_port=free_port(),
    )
    wait_until(lambda: RayCluster.objects.get(pk=ray.pk).status in ("running", "failed"), timeout=120, what="head")
    ray = RayCluster.objects.get(pk=ray.pk)
    assert ray.status == "running", ray.failure_reason

    job = services.training_job_create(
        actor=user,
        workspace=workspace,
        ray_cluster=ray,
        name="train",
        script=TRAIN,
        config={"lr": 0.01},
        storage_path=str(tmp_path / "ckpt"),
    )
    poll_workloads_until(
        lambda: TrainingJob.objects.get(pk=job.pk).status not in JobStatus.active(), "training job done"
    )
    job = TrainingJob.objects.get(pk=job.pk)
    assert job.status == JobStatus.SUCCEEDED, job.failure_reason or job.traceback or job.logs[-2000:]

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
    )
    deployment = ServeDeployment.objects.get(pk=deployment.pk)
    assert deployment.status == ServeStatus.RUNNING, deployment.failure_reason

    token = Token.objects.create(user=user)
    origin = serve_origin(deployment)
    url = control_plane.url + "/"
    moved = requests.post(control_plane.url + deployment.proxy_path, json={}, allow_redirects=False, timeout=30)
    assert (moved.status_code, moved.headers["location"]) == (
        307,
        f"http://{origin_names.SERVE.host(deployment.pk)}:{control_plane.ports[0]}/",
    )
    body = serve_answer(control_plane, deployment, token.key, {"prompt": "hi tunnel"}).json()
    assert body["input"] == {"prompt": "hi tunnel"}
    assert Path(body["checkpoint"]) == Path(job.latest_checkpoint)
    assert body["model"]["model.json"] == {"trained": True, "config": {"lr": 0.01}}

    with requests.post(
        url,
        json={"prompt": "hi tunnel"},
        stream=True,
        timeout=60,
        headers={"Authorization": f"Token {token.key}", "Accept": "text/event-stream", **origin},
    ) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream"), (stream.status_code, stream.text)
        events = [line[6:].decode() for line in stream.iter_lines() if line.startswith(b"data: ")]
    assert events[:2] == ['{"token": "hi"}', '{"token": "tunnel"}'], events
    assert events[-1] == "[DONE]"

    assert requests.post(url, json={}, headers=origin, timeout=30).status_code == 401
