"""A managed Ray cluster in real containers: the docker runtime end to end on real Podman.

Two agents (two compute nodes of one standalone cluster) run their Ray containers on Podman's Docker API
(DOCKER_HOST) from the image `.ci/ray-image` builds for the default version, 2.9.0. The containers use
the host network, the mode the runtime uses between hosts (Ray's guidance for multi-node clusters); the
two simulated hosts share this machine's network namespace, so each Ray node binds ports of its own and
the worker joins the head at the head's node IP. Pending work is a driver run inside the head container
(with the cluster's Ray, not the agent's); the autoscaler pass is the beat task's function, called on a
short loop.
"""

from __future__ import annotations

import textwrap
import time

import pytest
import requests
from django.conf import settings as django_settings
from django.test import Client

from agent.ray.commands import member_name
from agent.ray.ports import free_port
from fleet.models import Node
from raymgr import services as ray_services
from raymgr.models import RayCluster, RayNode
from raymgr.tasks import autoscale
from tests.support.node_container import podman
from tests.support.origin_client import redeem_ticket_redirect
from tests.support.processes import wait_until
from tests.support.ray_docker import VERSION, containers_of

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

DRIVER = textwrap.dedent(
    """
    import sys, time, ray
    ray.init(address="auto", logging_level="ERROR")
    cpus = float(sys.argv[1])

    @ray.remote(num_cpus=cpus)
    def busy():
        # Hold this node until a second one joined, so the other task must run there.
        deadline = time.time() + 600
        while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.time() < deadline:
            time.sleep(1)
        time.sleep(3)
        return ray.get_runtime_context().get_node_id()

    # Two tasks that each need a whole node: the second cannot run until a worker joins.
    nodes = ray.get([busy.remote(), busy.remote()])
    print("NODES", len(set(nodes)))
    """
)


def ray_cluster(pk) -> RayCluster:
    return RayCluster.objects.get(pk=pk)


@pytest.mark.timeout(1500)
def test_ray_cluster_in_containers_scales_up_and_down_and_leaves_no_container(
    control_plane, cluster, operator, agents, docker_env
):
    env, made = docker_env
    user, workspace = operator
    for name in ("ray-a", "ray-b"):
        agents(control_plane, cluster, user, name, extra_env=env)
    wait_until(lambda: Node.objects.filter(cluster=cluster, status="online").count() == 2, timeout=60, what="online")

    started = time.monotonic()
    ray = ray_services.ray_cluster_create(
        actor=user,
        workspace=workspace,
        compute_cluster=cluster,
        name="rc",
        runtime="docker",
        min_workers=0,
        max_workers=1,
        idle_timeout_s=3,
        gcs_port=free_port(),
        dashboard_port=free_port(),
    )
    made.append(str(ray.pk))
    assert ray.ray_version == VERSION  # the documented default
    wait_until(lambda: ray_cluster(ray.pk).status in ("running", "failed"), timeout=400, interval=1, what="head")
    ray = ray_cluster(ray.pk)
    assert ray.status == "running", ray.failure_reason
    head_s = time.monotonic() - started
    head = RayNode.objects.get(ray_cluster=ray, role="head")
    assert containers_of(ray.pk) == [member_name(str(head.pk))]
    assert ray.head_container_id

    # The Ray Dashboard of the head container answers through the tunnel proxy.
    browser = Client()
    browser.force_login(user)
    cookie = {django_settings.SESSION_COOKIE_NAME: browser.cookies[django_settings.SESSION_COOKIE_NAME].value}
    opened = requests.get(
        f"{control_plane.url}/ray/clusters/{ray.pk}/dashboard/api/version",
        cookies=cookie,
        allow_redirects=False,
        timeout=30,
    )
    assert opened.status_code == 302, opened.text
    on_origin = redeem_ticket_redirect(control_plane.url, opened.headers["location"])
    answers: list[requests.Response] = []

    def dashboard_answers() -> bool:
        answers.append(requests.get(f"{control_plane.url}/api/version", headers=on_origin, timeout=60))
        return answers[-1].status_code == 200

    wait_until(dashboard_answers, timeout=120, interval=2, what="the Ray Dashboard through the proxy")
    assert answers[-1].json()["ray_version"] == VERSION

    # Work beyond the head's capacity → the autoscaler adds a worker container on the other node.
    cpus = str(float(head.node.cpu_count))
    run_driver = f"python -c '{DRIVER}' {cpus} > /tmp/driver.out 2>&1"
    driver = podman("exec", "-d", member_name(str(head.pk)), "sh", "-c", run_driver)
    assert driver.returncode == 0
    started = time.monotonic()

    def worker_running() -> bool:
        autoscale()
        return RayNode.objects.filter(ray_cluster=ray, role="worker", status="running").exists()

    wait_until(worker_running, timeout=400, interval=2, what="a worker added for pending work")
    scale_up_s = time.monotonic() - started
    worker = RayNode.objects.get(ray_cluster=ray, role="worker", status="running")
    assert worker.node_id != head.node_id
    assert member_name(str(worker.pk)) in containers_of(ray.pk)

    def driver_done() -> bool:
        out = podman("exec", member_name(str(head.pk)), "cat", "/tmp/driver.out", check=False).stdout
        return "NODES" in out

    wait_until(driver_done, timeout=300, interval=2, what="the driver to finish")
    out = podman("exec", member_name(str(head.pk)), "cat", "/tmp/driver.out").stdout
    assert "NODES 2" in out, out  # the worker container ran one of the tasks

    # Idle past the timeout → the worker is drained through the head and its container removed.
    started = time.monotonic()

    def worker_gone() -> bool:
        autoscale()
        worker.refresh_from_db()
        return worker.status == "stopped"

    wait_until(worker_gone, timeout=300, interval=2, what="the idle worker removed")
    scale_down_s = time.monotonic() - started
    assert ray.events.filter(kind="worker_drained").exists()
    wait_until(lambda: containers_of(ray.pk) == [member_name(str(head.pk))], timeout=60, what="worker container gone")
    print(
        f"\nhead running in {head_s:.0f} s; worker added and running in {scale_up_s:.0f} s; "
        f"idle worker drained and removed in {scale_down_s:.0f} s"
    )

    # Stop → no container; Start → a head container again; Delete → no container, no row.
    ray_services.ray_cluster_stop(actor=user, cluster=ray_cluster(ray.pk))
    wait_until(lambda: ray_cluster(ray.pk).status == "stopped" and not containers_of(ray.pk), timeout=180, what="stop")

    def node_statuses() -> set[str]:
        return set(RayNode.objects.filter(ray_cluster=ray).values_list("status", flat=True))

    # the cluster reads stopped once its head is down; a node's own stop result may land a moment later
    wait_until(lambda: node_statuses() == {"stopped"}, timeout=60, what="every Ray node stopped")
    ray_services.ray_cluster_start(actor=user, cluster=ray_cluster(ray.pk))
    wait_until(lambda: ray_cluster(ray.pk).status in ("running", "failed"), timeout=400, interval=1, what="restart")
    assert ray_cluster(ray.pk).status == "running", ray_cluster(ray.pk).failure_reason
    assert len(containers_of(ray.pk)) == 1
    ray_services.ray_cluster_delete(actor=user, cluster=ray_cluster(ray.pk))
    wait_until(lambda: not RayCluster.objects.filter(pk=ray.pk).exists(), timeout=180, what="cluster deleted")
    assert containers_of(ray.pk) == []
