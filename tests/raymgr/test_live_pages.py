"""Ray pages update themselves: the cluster header and the workload pages poll until their state settles."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from raymgr import services as ray_services
from raymgr.models import RayCluster
from raymgr.workloads import services
from raymgr.workloads.models import ServeDeployment, TrainingJob
from tests.raymgr.conftest import last_command, start_head

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def browser(owner) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def test_cluster_header_follows_the_status_until_it_settles(browser, compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    url = f"/ray/clusters/{cluster.pk}/"
    created = browser.get("/ray/clusters/")  # the list polls while a cluster is pending
    assert 'id="ray-cluster-rows" hx-get="/ray/clusters/" hx-trigger="every 3s"' in created.content.decode()
    page = browser.get(url).content.decode()
    assert 'id="ray-cluster-head" hx-get="/ray/clusters/' in page
    assert 'data-status="pending"' in page
    assert "Open Ray Dashboard" not in page

    start_head(cluster)  # the head's start succeeds: running
    poll = browser.get(f"{url}?part=head", HTTP_HX_TRIGGER="ray-cluster-head", **HX)
    body = poll.content.decode()
    assert poll.status_code == 200  # a running cluster is still watched (it may fail), every 30 s
    assert "<html" not in body
    assert 'data-status="running"' in body
    assert "Open Ray Dashboard" in body
    assert 'hx-trigger="every 30s"' in body
    rows = browser.get("/ray/clusters/", HTTP_HX_TRIGGER="ray-cluster-rows", **HX)
    assert rows.status_code == 286  # nothing pending any more: the list stops polling

    RayCluster.objects.filter(pk=cluster.pk).update(status="failed", failure_reason="Traceback\nOSError: no space")
    poll = browser.get(f"{url}?part=head", HTTP_HX_TRIGGER="ray-cluster-head", **HX)
    body = poll.content.decode()
    assert poll.status_code == 286  # failed: settled, polling stops
    assert 'data-status="failed"' in body
    assert "OSError: no space" in body
    assert "Open Ray Dashboard" not in body
    assert "hx-trigger" not in body


def test_created_banner_does_not_freeze_a_status(browser, compute, add_node):
    add_node(compute, "cpu-1")
    response = browser.post(
        "/ray/clusters/new/",
        {
            "name": "fresh",
            "compute_cluster": str(compute.pk),
            "ray_version": "2.9.0",
            "runtime": "docker",
            "min_workers": "0",
            "max_workers": "0",
            "idle_timeout_s": "300",
            "gcs_port": "6380",
            "dashboard_port": "8265",
        },
        follow=True,
    )
    page = response.content.decode()
    assert "Ray cluster fresh created." in page
    assert "created (Pending)" not in page
    assert 'data-status="pending"' in page


def test_cluster_header_poll_query_count_is_pinned(browser, compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    with CaptureQueriesContext(connection) as queries:
        assert browser.get(f"/ray/clusters/{cluster.pk}/?part=head", **HX).status_code == 200
    # session, user, the cluster (with its compute cluster and workspace), the Owner/Admin check (guardian)
    assert len(queries) == 6, [q["sql"] for q in queries.captured_queries]


@pytest.fixture
def running(compute, add_node, make_ray):
    add_node(compute, "box-1")
    cluster = make_ray(runtime="process", max_workers=0)
    start_head(cluster)
    return cluster


def test_training_page_polls_from_queued_to_succeeded(browser, owner, workspace, running):
    job = services.training_job_create(
        actor=owner, workspace=workspace, ray_cluster=running, name="t1", script="print(1)\n"
    )
    url = f"/ray/training/{job.pk}/"
    page = browser.get(url).content.decode()
    assert f'id="workload-live" hx-get="{url}" hx-trigger="every 3s"' in page
    TrainingJob.objects.filter(pk=job.pk).update(status="running", logs="epoch 1")
    poll = browser.get(url, HTTP_HX_TRIGGER="workload-live", **HX)
    assert poll.status_code == 200
    assert "epoch 1" in poll.content.decode()
    assert ">Running</span>" in poll.content.decode()
    TrainingJob.objects.filter(pk=job.pk).update(status="succeeded")
    with CaptureQueriesContext(connection) as queries:
        poll = browser.get(url, HTTP_HX_TRIGGER="workload-live", **HX)
    body = poll.content.decode()
    assert poll.status_code == 286
    assert ">Succeeded</span>" in body
    assert "hx-trigger" not in body
    assert "<html" not in body
    assert len(queries) <= 8, [q["sql"] for q in queries.captured_queries]


def test_serve_page_polls_fast_while_deploying_and_slowly_while_serving(browser, owner, workspace, running):
    job = services.training_job_create(actor=owner, workspace=workspace, ray_cluster=running, name="t", script="1\n")
    TrainingJob.objects.filter(pk=job.pk).update(status="succeeded", checkpoints=[{"path": "/ck/final"}])
    job.refresh_from_db()
    deployment = services.serve_deployment_create(
        actor=owner, workspace=workspace, ray_cluster=running, name="s1", checkpoint_job=job
    )
    url = f"/ray/serving/{deployment.pk}/"
    assert 'hx-trigger="every 3s"' in browser.get(url).content.decode()
    ServeDeployment.objects.filter(pk=deployment.pk).update(status="running")
    assert 'hx-trigger="every 30s"' in browser.get(url, HTTP_HX_TRIGGER="workload-live", **HX).content.decode()
    ServeDeployment.objects.filter(pk=deployment.pk).update(status="stopped")
    assert browser.get(url, HTTP_HX_TRIGGER="workload-live", **HX).status_code == 286


def test_tune_page_is_live_while_running(browser, owner, workspace, running):
    experiment = services.tune_experiment_create(
        actor=owner,
        workspace=workspace,
        ray_cluster=running,
        name="sweep",
        search_space={"x": {"type": "uniform", "lower": 0, "upper": 5}},
        max_iterations=4,
        training_script="print(1)\n",
    )
    url = f"/ray/tune/{experiment.pk}/"
    assert 'hx-trigger="every 3s"' in browser.get(url).content.decode()
    assert last_command("ray.job.submit") is not None


def test_workload_lists_poll_while_a_row_is_in_progress(browser, owner, workspace, running):
    job = services.training_job_create(actor=owner, workspace=workspace, ray_cluster=running, name="t", script="1\n")
    page = browser.get("/ray/training/").content.decode()
    assert 'id="workload-rows" hx-get="/ray/training/" hx-trigger="every 3s"' in page
    TrainingJob.objects.filter(pk=job.pk).update(status="failed")
    poll = browser.get("/ray/training/", HTTP_HX_TRIGGER="workload-rows", **HX)
    assert poll.status_code == 286
    assert ">Failed</span>" in poll.content.decode()
    assert "<html" not in poll.content.decode()
    for url in ("/ray/tune/", "/ray/serving/"):  # nothing in progress there: settled from the start
        assert 'id="workload-rows" data-live="settled"' in browser.get(url).content.decode()


def test_status_polls_are_the_systems_and_an_operators_start_is_theirs(browser, owner, compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    head_start = last_command("ray.head.start", cluster_id=str(cluster.pk))
    assert (head_start.system, head_start.created_by) == (False, owner)  # part of the operator's create
    start_head(cluster)
    ray_services.autoscale_pass()  # the beat's pass asks the head for its status
    poll = last_command("ray.status", cluster_id=str(cluster.pk))
    assert (poll.system, poll.created_by) == (True, None)
    page = browser.get(f"/compute/clusters/{compute.pk}/commands/").content.decode()
    assert f'id="command-{head_start.pk}"' in page
    assert f'id="command-{poll.pk}"' not in page  # hidden until "Show system commands"
    shown = browser.get(f"/compute/clusters/{compute.pk}/commands/?show_system=1").content.decode()
    assert f'id="command-{poll.pk}"' in shown


def test_cluster_pages_keep_polling_while_stopping(browser, owner, compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    start_head(cluster)
    ray_services.ray_cluster_stop(actor=owner, cluster=cluster)
    url = f"/ray/clusters/{cluster.pk}/"
    poll = browser.get(f"{url}?part=head", HTTP_HX_TRIGGER="ray-cluster-head", **HX)
    body = poll.content.decode()
    assert poll.status_code == 200
    assert 'data-status="stopping"' in body
    assert ">Stopping<" in body
    assert 'hx-trigger="every 3s"' in body  # transitional: keeps polling fast
    assert ">Start</button>" not in body  # not until it has stopped
    assert "wait until it has stopped" in body
    summary = browser.get(f"{url}?tab=summary", HTTP_HX_TRIGGER="ray-summary", **HX)
    assert summary.status_code == 200
    assert 'hx-trigger="every 3s"' in summary.content.decode()
    rows = browser.get("/ray/clusters/", HTTP_HX_TRIGGER="ray-cluster-rows", **HX)
    assert rows.status_code == 200  # the list keeps polling (286 would stop it)
    assert ">Stopping<" in rows.content.decode()

    from tests.raymgr.conftest import finish

    finish(last_command("ray.node.stop", cluster_id=str(cluster.pk)))
    poll = browser.get(f"{url}?part=head", HTTP_HX_TRIGGER="ray-cluster-head", **HX)
    assert poll.status_code == 286  # stopped: settled
    assert 'data-status="stopped"' in poll.content.decode()
    assert ">Start</button>" in poll.content.decode()
