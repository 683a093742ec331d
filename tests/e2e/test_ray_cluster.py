"""A managed Ray cluster end to end on two local nodes, every hop real.

Services dispatch `ray.*` commands → Celery worker → channel layer → daphne's tunnel consumer → the node's
agent, which runs Ray head/worker as host processes (the `process` runtime) → results come back through
the tunnel and advance the cluster (fleet's `command_finished` signal, handled in daphne). The autoscaler
pass is the beat task's function, called here on a short loop instead of every 15 s.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from urllib.parse import urlsplit

import pytest
import requests
from django.conf import settings as django_settings
from django.test import Client

from agent.ray.ports import free_port
from fleet import origin_names
from fleet.models import Node
from raymgr import services as ray_services
from raymgr.models import RayCluster, RayNode
from raymgr.tasks import autoscale
from tests.support.origin_client import redeem_ticket_redirect
from tests.support.processes import REPO_ROOT, VENV_BIN, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

DRIVER = textwrap.dedent(
    """
    import sys, time, ray
    ray.init(address=sys.argv[1], logging_level="ERROR")
    cpus = float(sys.argv[2])

    @ray.remote(num_cpus=cpus)
    def busy(seconds):
        time.sleep(seconds)
        return ray.get_runtime_context().get_node_id()

    # Two tasks that each need a whole node: the second cannot run until a worker joins.
    nodes = ray.get([busy.remote(20), busy.remote(20)])
    print("NODES", len(set(nodes)))
    """
)


def ray_cluster(pk) -> RayCluster:
    return RayCluster.objects.get(pk=pk)


@pytest.mark.timeout(600)
def test_ray_cluster_scales_up_for_work_then_down_and_stops_starts_deletes(
    control_plane, cluster, operator, agents, no_leftover_ray
):
    user, workspace = operator
    for name in ("ray-a", "ray-b"):
        agents(control_plane, cluster, user, name)
    wait_until(lambda: Node.objects.filter(cluster=cluster, status="online").count() == 2, timeout=30, what="online")

    ray = ray_services.ray_cluster_create(
        actor=user,
        workspace=workspace,
        compute_cluster=cluster,
        name="rc",
        runtime="process",
        min_workers=0,
        max_workers=1,
        idle_timeout_s=3,
        gcs_port=free_port(),
        dashboard_port=free_port(),
    )
    wait_until(lambda: ray_cluster(ray.pk).status in ("running", "failed"), timeout=120, what="head running")
    ray = ray_cluster(ray.pk)
    assert ray.status == "running", ray.failure_reason
    assert ray.head_ip
    head_node = ray.head_node

    # The Ray Dashboard answers through the tunnel proxy, for a signed-in member only.
    browser = Client()
    browser.force_login(user)
    cookie = {django_settings.SESSION_COOKIE_NAME: browser.cookies[django_settings.SESSION_COOKIE_NAME].value}
    # The control plane's dashboard link checks the session and sends the browser, with a single-use
    # ticket, to the dashboard's own origin; the session cookie never goes there.
    opened = requests.get(
        f"{control_plane.url}/ray/clusters/{ray.pk}/dashboard/api/version",
        cookies=cookie,
        allow_redirects=False,
        timeout=30,
    )
    assert opened.status_code == 302, opened.text
    assert opened.headers["location"].startswith(f"http://{origin_names.DASHBOARD.host(ray.pk)}:")
    on_origin = redeem_ticket_redirect(control_plane.url, opened.headers["location"])
    answers: list[requests.Response] = []

    def dashboard_answers() -> bool:  # the dashboard comes up a few seconds after the head
        answers.append(requests.get(f"{control_plane.url}/api/version", headers=on_origin, timeout=60))
        return answers[-1].status_code == 200

    wait_until(dashboard_answers, timeout=60, interval=1, what="the Ray Dashboard through the proxy")
    version = answers[-1]
    assert version.json()["ray_version"] == "2.60.0"
    anonymous = {"Host": on_origin["Host"]}
    assert requests.get(f"{control_plane.url}/api/version", headers=anonymous, timeout=30).status_code == 401
    with_session = requests.get(f"{control_plane.url}/api/version", headers=anonymous, cookies=cookie, timeout=30)
    assert with_session.status_code == 401  # the control plane's session is no key to the dashboard's origin
    ticket = urlsplit(opened.headers["location"])
    again = requests.get(f"{control_plane.url}{ticket.path}?{ticket.query}", headers=anonymous, timeout=30)
    assert again.status_code == 403  # a ticket lets one browser in, once

    # Work that exceeds the head's capacity → the autoscaler adds a worker on the other node.
    cpus = str(float(head_node.cpu_count))
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, f"{ray.head_ip}:{ray.gcs_port}", cpus],
        cwd=REPO_ROOT,
        env={"PATH": f"{VENV_BIN}:/usr/bin:/bin", "RAY_USAGE_STATS_ENABLED": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def worker_running() -> bool:
            autoscale()
            return RayNode.objects.filter(ray_cluster=ray, role="worker", status="running").exists()

        wait_until(worker_running, timeout=180, interval=2, what="a worker added for pending work")
        worker = RayNode.objects.get(ray_cluster=ray, role="worker", status="running")
        assert worker.node_id != head_node.pk
        assert ray.events.filter(kind="autoscaler", message__icontains="add").exists()
        output, _ = driver.communicate(timeout=180)
        assert "NODES 2" in output, output
    finally:
        if driver.poll() is None:
            driver.kill()

    # Idle past the timeout → the worker is drained and removed; min_workers 0 is respected.
    def worker_gone() -> bool:
        autoscale()
        worker.refresh_from_db()
        return worker.status == "stopped"

    wait_until(worker_gone, timeout=180, interval=2, what="the idle worker removed")
    assert ray.events.filter(kind="autoscaler", message__icontains="removing worker").exists()

    # Stop → everything stopped; Start → head back; Delete → rows gone.
    ray_services.ray_cluster_stop(actor=user, cluster=ray_cluster(ray.pk))
    wait_until(
        lambda: (
            set(RayNode.objects.filter(ray_cluster=ray).values_list("status", flat=True)) == {"stopped"}
            and ray_cluster(ray.pk).status == "stopped"
        ),
        timeout=120,
        what="cluster stopped",
    )
    ray_services.ray_cluster_start(actor=user, cluster=ray_cluster(ray.pk))
    wait_until(lambda: ray_cluster(ray.pk).status == "running", timeout=120, what="cluster running again")
    ray_services.ray_cluster_delete(actor=user, cluster=ray_cluster(ray.pk))
    wait_until(lambda: not RayCluster.objects.filter(pk=ray.pk).exists(), timeout=120, what="cluster deleted")
