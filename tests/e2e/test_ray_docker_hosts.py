"""A Ray cluster in real containers across two simulated hosts, at the second pinned Ray version (2.60.0).

Between hosts the docker runtime runs every Ray node with the host network (``--network host``, Ray's
guidance for multi-node clusters): a node advertises its machine's address and the others dial it there,
on whatever ports Ray opens. `test_ray_docker.py` runs both simulated hosts in this machine's network
namespace, so every node has the same address; here each host is a network namespace of its own
(`tests.support.netns`): its own address on a bridge (10.213.<k>.1 and .2), its own Podman service (whose
host-network containers share that namespace, as they share a real machine's network) and its own agent,
whose DOCKER_HOST is that service. The control plane listens on the bridge's address (.254), as on a
separate machine. So the worker on host B can only join the head on host A at A's address across the
bridge, and the head's raylet reaches B's: a wrong advertised address would fail the test.

Host A's default route goes over a second interface, as on a machine whose default route is a
management network: Ray alone would advertise that address, so agent A sets CLEVERTHIS_RAY_NODE_IP to its
bridge address, while host B (default route via the bridge) keeps Ray's own pick.

The cluster runs Ray 2.60.0 (`test_ray_docker.py` covers 2.9.0, the default) from the image
`.ci/ray-image 2.60.0` builds (skip when absent). The agents cannot import Ray at all (a stand-in package
that refuses to load shadows it), so the head's status and drain calls that find, drain and remove the
worker can only have run inside the head container, with the cluster's own Ray.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import requests
from django.conf import settings as django_settings
from django.test import Client

from agent.ray.commands import member_name
from agent.ray.ports import free_port
from fleet import services
from fleet.models import Node
from raymgr import services as ray_services
from raymgr.models import RayCluster, RayNode
from raymgr.tasks import autoscale
from tests.agent.executors.podman import require_podman
from tests.support.environment import missing
from tests.support.live import ControlPlane, subprocess_env
from tests.support.netns import SimulatedHost, simulated_hosts, unavailable_reason
from tests.support.node_container import podman
from tests.support.origin_client import redeem_ticket_redirect
from tests.support.processes import REPO_ROOT, ManagedProcess, clean_environ, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

VERSION = "2.60.0"
IMAGE = f"docker.io/rayproject/ray:{VERSION}"
RAY_ENV = {"CLEVERTHIS_RAY_MEMORY": "3g", "CLEVERTHIS_RAY_SHM_SIZE": "768m"}
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
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    # Two tasks that each need a whole node: the second cannot run until a worker joins.
    ran = ray.get([busy.remote(), busy.remote()])
    print("NODES", len({node for node, _ in ran}))
    print("IPS", " ".join(sorted({ip for _, ip in ran})))
    """
)
# What `ray._private.services` picks on its own: the address of the default route's interface.
DEFAULT_PICK = "from ray._private.services import get_node_ip_address as pick; print('PICK', pick())"


def ray_cluster(pk) -> RayCluster:
    return RayCluster.objects.get(pk=pk)


def containers_of(cluster_id) -> list[str]:
    """The cluster's containers (the hosts share one Podman storage: every service lists all of them)."""
    listed = podman("ps", "-a", "--format", "{{.Names}}", "--filter", f"label=cleverthis.ray.cluster={cluster_id}")
    return sorted(listed.stdout.split())


def host_of(name: str, hosts: list[SimulatedHost]) -> str:
    """The simulated host whose network namespace container `name` runs in ('' if none)."""
    pid = int(podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip() or 0)
    return next((host.netns for host in hosts if pid and host.runs(pid)), "")


@pytest.fixture
def network(tmp_path):
    """Two simulated hosts, or a skip saying why they cannot be made here; containers removed after."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    require_podman()  # the storage and configuration of .ci/podman-setup
    if podman("image", "exists", IMAGE, check=False).returncode != 0:
        missing(f"no rayproject/ray:{VERSION} image", f"run `.ci/ray-image {VERSION}` (as root) to build it")
    made: list[str] = []
    with simulated_hosts(2, tmp_path) as net:
        try:
            yield net, made
        finally:  # before the namespaces go: a namespace lives on while a container runs in it
            for cluster_id in made:
                for name in containers_of(cluster_id):
                    podman("rm", "-f", "-t", "1", name, check=False)


@pytest.fixture
def hosted_agents(tmp_path):
    """Start an agent inside a simulated host; all stopped at the end."""
    started: list[ManagedProcess] = []
    # A `ray` package that refuses to load, ahead of the real one: the agents cannot run Ray code themselves.
    shadow = tmp_path / "no-ray"
    (shadow / "ray").mkdir(parents=True)
    (shadow / "ray" / "__init__.py").write_text(
        'raise ImportError("this test agent must not run Ray itself: Ray calls belong in the containers")\n'
    )

    def start(host: SimulatedHost, url: str, cluster, user, name: str, env: dict[str, str]) -> ManagedProcess:
        _, raw = services.join_token_create(cluster=cluster, actor=user)
        state = tmp_path / f"state-{name}"
        joined = subprocess.run(
            host.argv([sys.executable, "-m", "agent", "join", "--url", url, "--token", raw, "--state-dir", str(state)]),
            cwd=REPO_ROOT,
            env=clean_environ(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert joined.returncode == 0, joined.stderr
        proc = ManagedProcess(
            f"agent-{name}",
            host.argv([sys.executable, "-m", "agent", "run", "--state-dir", str(state)]),
            log_dir=tmp_path,
            env={
                "PYTHONPATH": f"{shadow}:{REPO_ROOT}",
                "DOCKER_HOST": host.docker_host,
                "CLEVERTHIS_MODEL_CACHE": str(tmp_path / f"models-{name}"),
                **RAY_ENV,
                **env,
            },
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def bridge_plane(network, tmp_path, settings):
    """The control plane on the bridge's address (a machine of its own, as seen from the hosts)."""
    net, _ = network
    settings.NODE_OFFLINE_AFTER_S = 3
    port = free_port()
    env = subprocess_env(NODE_OFFLINE_AFTER_S="3", CONTROL_PLANE_URL=f"http://{net.bridge_address}:{port}")
    plane = ControlPlane(log_dir=tmp_path, env=env, host=net.bridge_address)
    plane.start_replica(port)
    plane.start_worker()
    yield plane
    plane.stop()


@pytest.mark.timeout(1500)
def test_ray_cluster_across_two_network_namespaces_at_ray_2_60(cluster, operator, network, bridge_plane, hosted_agents):
    net, made = network
    plane = bridge_plane
    host_a, host_b = net.hosts
    user, workspace = operator
    decoy = host_a.decoy_default_route()

    # Host A alone first: the head is placed there.
    agent_a = hosted_agents(host_a, plane.url, cluster, user, "a", {"CLEVERTHIS_RAY_NODE_IP": host_a.address})
    wait_until(lambda: Node.objects.filter(cluster=cluster, status="online").count() == 1, timeout=60, what="A online")
    node_a = Node.objects.get(cluster=cluster)

    started = time.monotonic()
    ray = ray_services.ray_cluster_create(
        actor=user,
        workspace=workspace,
        compute_cluster=cluster,
        name="rc",
        ray_version=VERSION,
        runtime="docker",
        min_workers=0,
        max_workers=1,
        idle_timeout_s=3,
        gcs_port=free_port(),
        dashboard_port=free_port(),
    )
    made.append(str(ray.pk))
    wait_until(lambda: ray_cluster(ray.pk).status in ("running", "failed"), timeout=400, interval=1, what="head")
    ray = ray_cluster(ray.pk)
    assert ray.status == "running", f"{ray.failure_reason}\n{agent_a.log()[-3000:]}"
    head_s = time.monotonic() - started
    head = RayNode.objects.get(ray_cluster=ray, role="head")
    head_name = member_name(str(head.pk))
    assert head.node_id == node_a.pk
    assert containers_of(ray.pk) == [head_name]
    assert host_of(head_name, net.hosts) == host_a.netns  # the container shares host A's network
    # Ray on its own would advertise the decoy (A's default route); the head advertises A's bridge address.
    picked = host_a.podman("exec", head_name, "python", "-c", DEFAULT_PICK).stdout
    assert f"PICK {decoy}" in picked, picked
    assert ray.head_ip == host_a.address
    assert ray.gcs_address == f"{host_a.address}:{ray.gcs_port}"
    version = host_a.podman("exec", head_name, "python", "-c", "import ray; print(ray.__version__)").stdout
    assert version.strip() == VERSION

    # The Ray Dashboard of the head (loopback of host A) answers through agent A's tunnel.
    browser = Client()
    browser.force_login(user)
    cookie = {django_settings.SESSION_COOKIE_NAME: browser.cookies[django_settings.SESSION_COOKIE_NAME].value}
    opened = requests.get(
        f"{plane.url}/ray/clusters/{ray.pk}/dashboard/api/version", cookies=cookie, allow_redirects=False, timeout=30
    )
    assert opened.status_code == 302, opened.text
    on_origin = redeem_ticket_redirect(plane.url, opened.headers["location"])
    answers: list[requests.Response] = []

    def dashboard_answers() -> bool:
        answers.append(requests.get(f"{plane.url}/api/version", headers=on_origin, timeout=60))
        return answers[-1].status_code == 200

    wait_until(dashboard_answers, timeout=120, interval=2, what="the Ray Dashboard through the proxy")
    assert answers[-1].json()["ray_version"] == VERSION

    # Host B joins the compute cluster; its agent keeps Ray's own address pick (its default route is the bridge).
    hosted_agents(host_b, plane.url, cluster, user, "b", {})
    wait_until(lambda: Node.objects.filter(cluster=cluster, status="online").count() == 2, timeout=60, what="B online")
    node_b = Node.objects.exclude(pk=node_a.pk).get(cluster=cluster)

    # Work beyond the head's capacity → the autoscaler adds a worker container on host B.
    cpus = str(float(head.node.cpu_count))
    driver = host_a.podman("exec", "-d", head_name, "sh", "-c", f"python -c '{DRIVER}' {cpus} > /tmp/driver.out 2>&1")
    assert driver.returncode == 0
    started = time.monotonic()
    placed: list[float] = []

    def worker_running() -> bool:
        autoscale()
        workers = RayNode.objects.filter(ray_cluster=ray, role="worker")
        if not placed and workers.exists():
            placed.append(time.monotonic())
        return workers.filter(status="running").exists()

    wait_until(worker_running, timeout=400, interval=2, what="a worker added for pending work")
    done = time.monotonic()
    scale_up_s, join_s = done - started, done - placed[0]
    worker = RayNode.objects.get(ray_cluster=ray, role="worker", status="running")
    worker_name = member_name(str(worker.pk))
    assert worker.node_id == node_b.pk
    assert containers_of(ray.pk) == sorted([head_name, worker_name])
    assert host_of(worker_name, net.hosts) == host_b.netns

    def driver_done() -> bool:
        out = host_a.podman("exec", head_name, "cat", "/tmp/driver.out", check=False).stdout
        return "IPS" in out or "Traceback" in out

    wait_until(driver_done, timeout=300, interval=2, what="the driver to finish")
    out = host_a.podman("exec", head_name, "cat", "/tmp/driver.out").stdout
    assert "NODES 2" in out, out
    # One task ran on each host, each node at its own bridge address.
    assert f"IPS {' '.join(sorted([host_a.address, host_b.address]))}" in out, out

    # Idle past the timeout → drained through the head container (Ray 2.60.0) and the container removed.
    started = time.monotonic()

    def worker_gone() -> bool:
        autoscale()
        worker.refresh_from_db()
        return worker.status == "stopped"

    wait_until(worker_gone, timeout=300, interval=2, what="the idle worker removed")
    scale_down_s = time.monotonic() - started
    assert ray.events.filter(kind="worker_drained").exists()
    wait_until(lambda: containers_of(ray.pk) == [head_name], timeout=60, what="worker container gone")
    print(
        f"\nRay {VERSION} across network namespaces: head running in {head_s:.0f} s; worker added in "
        f"{scale_up_s:.0f} s (joined {join_s:.0f} s after it was placed); idle worker drained and removed in "
        f"{scale_down_s:.0f} s"
    )

    # Delete → no container on either host, no row.
    ray_services.ray_cluster_delete(actor=user, cluster=ray_cluster(ray.pk))
    wait_until(lambda: not RayCluster.objects.filter(pk=ray.pk).exists(), timeout=180, what="cluster deleted")
    assert containers_of(ray.pk) == []
