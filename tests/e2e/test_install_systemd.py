"""The join command for real: install.sh under systemd in a booted Debian container.

A real daphne + Celery worker serve the control plane on 127.0.0.1; a Podman container built by
`.ci/node-image` boots systemd, shares the host's network, and has the host's Podman service as its
Docker engine (`/run/docker.sock`). The operator's steps are taken as the product docs tell them: the
join command is the one the Generate Join Token dialog shows, run verbatim in the node's shell (curl
from the control plane, piped to sh); the agent is then managed with systemctl and read with
journalctl; Delete is the Nodes tab's button. pip inside the node installs from a wheelhouse of the
agent's dependencies (PIP_ARGS, which install.sh honours): nothing is downloaded while this runs.
"""

from __future__ import annotations

import html
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import requests

from fleet import services
from fleet.models import Command, JoinToken, Node, NodeEvent
from tests.agent.executors.podman import TEST_IMAGE, podman_url, require_podman
from tests.support.live import ControlPlane, subprocess_env
from tests.support.node_container import PIP_ARGS, NodeContainer, node_image
from tests.support.processes import free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(900)]

UNIT = "cleverthis-agent"
STATE = "/etc/cleverthis-agent"
RUN_LABEL = "io.cleverthis.test-run"


class Pages:
    """A signed-in browser session on the live control plane's pages (forms, CSRF, htmx requests)."""

    def __init__(self, url: str, username: str, password: str) -> None:
        self.url = url
        self.session = requests.Session()
        self.session.get(f"{url}/accounts/login/", timeout=30).raise_for_status()
        signed_in = self.session.post(
            f"{url}/accounts/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": self.session.cookies["csrftoken"]},
            timeout=30,
        )
        assert signed_in.ok, signed_in.text[:500]
        assert "sessionid" in self.session.cookies, signed_in.text[:500]

    def click(self, path: str) -> requests.Response:
        """An htmx button: POST with the CSRF header, as the page's hx-post does."""
        return self.session.post(
            f"{self.url}{path}",
            headers={"X-CSRFToken": self.session.cookies["csrftoken"], "HX-Request": "true"},
            timeout=30,
        )

    def join_command(self, cluster) -> str:
        """Click Generate Join Token on the cluster's Commands tab; the command the dialog shows."""
        dialog = self.click(f"/compute/clusters/{cluster.pk}/join-tokens/")
        assert dialog.status_code == 200, dialog.text[:500]
        found = re.search(r'<code class="secret"[^>]*>(.*?)</code>', dialog.text, re.S)
        assert found, dialog.text
        return html.unescape(found.group(1)).strip()


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    # Its own sdist cache: other suites' daphnes build theirs from other checkouts.
    env = subprocess_env(AGENT_PACKAGE_CACHE_DIR=str(tmp_path / "agent-package"))
    control_plane = ControlPlane(log_dir=tmp_path, env=env)
    try:
        control_plane.start_replica()
        control_plane.start_worker()
        yield control_plane
    finally:
        control_plane.stop()


@pytest.fixture
def pages(plane: ControlPlane, operator) -> Pages:
    user, _ = operator
    return Pages(plane.url, user.get_username(), "pw-ops")


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def node_host(run_id: str) -> Iterator[NodeContainer]:
    """A freshly booted node; afterwards it is removed, with the containers its agent created."""
    image, wheelhouse = node_image()
    socket = Path(require_podman().removeprefix("unix://"))
    box = NodeContainer.boot(image, wheelhouse=wheelhouse, docker_socket=socket)
    try:
        yield box
    finally:
        box.remove()
        url = podman_url()
        if url:
            engine = docker.DockerClient(base_url=url)
            for container in engine.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}):
                container.remove(force=True, v=True)
            engine.close()


def run_as_operator(node: NodeContainer, command: str, **env: str):
    """The operator pastes `command` into a root shell on the node (pip pointed at the wheelhouse)."""
    return node.sh(command, env={"PIP_ARGS": PIP_ARGS, **env})


def connected_events(node_id: str) -> int:
    return NodeEvent.objects.filter(node_id=node_id, kind="connected").count()


def diagnose(plane: ControlPlane, node: NodeContainer) -> str:
    status = node.sh(f"systemctl status {UNIT} --no-pager; journalctl -u {UNIT} --no-pager -n 60").stdout
    return f"{status}\n{plane.logs()}"


def test_join_command_installs_a_systemd_service(plane, pages, cluster, operator, node_host, run_id):
    user, _ = operator
    node = node_host

    # The join command exactly as the dialog shows it, pasted into a root shell on the node.
    join = pages.join_command(cluster)
    assert re.fullmatch(rf"curl -fsSL {plane.url}/agent/install\.sh \| CLUSTER_TOKEN=ct_node_[\w-]+ sh", join), join
    token = join.split("CLUSTER_TOKEN=")[1].split()[0]
    started = time.monotonic()
    installed = run_as_operator(node, join)
    install_s = time.monotonic() - started
    output = installed.stdout + installed.stderr
    assert installed.returncode == 0, output
    assert token not in output
    assert "Docker is installed and running" in installed.stdout  # docker info, through the engine's socket
    assert "registration successful" in installed.stdout  # what the docs tell operators to look for

    node_id = json.loads(node.sh(f"cat {STATE}/node.json").stdout)["node_id"]
    registered = Node.objects.get(pk=node_id)
    assert registered.cluster_id == cluster.pk
    assert registered.name == node.hostname
    wait_until(lambda: Node.objects.get(pk=node_id).status == "online", timeout=30, what="node online")
    assert node.systemctl("is-active", UNIT) == "active", diagnose(plane, node)
    assert node.systemctl("is-enabled", UNIT) == "enabled"

    # The journal shows what the docs list.
    wait_until(lambda: "heartbeat sent" in node.journal(UNIT), timeout=15, what="a heartbeat in the journal")
    journal = node.journal(UNIT)
    host = plane.url.removeprefix("http://")
    assert f"connected to {host}" in journal, journal
    assert "no GPU detected" in journal

    # A command from the control plane runs through the node's Docker engine.
    (create,) = services.command_dispatch(
        actor=user,
        cluster=cluster,
        command_type="container.create",
        payload={
            "image": TEST_IMAGE,
            "name": f"e2e-{run_id}",
            "command": ["sleep", "300"],
            "labels": {RUN_LABEL: run_id},
        },
        node=registered,
    )
    wait_until(
        lambda: Command.objects.get(pk=create.pk).status in ("succeeded", "failed"), timeout=60, what="container"
    )
    create.refresh_from_db()
    assert create.status == "succeeded", (create.error, diagnose(plane, node))
    assert "command received: container.create" in node.journal(UNIT)
    engine = docker.DockerClient(base_url=require_podman())
    try:
        (made,) = engine.containers.list(filters={"label": f"{RUN_LABEL}={run_id}"})
        assert made.name == f"e2e-{run_id}"
    finally:
        engine.close()

    # systemctl restart: the node is back within the docs' 5-10 s.
    pid_before = node.unit_properties(UNIT, "MainPID")["MainPID"]
    connects = connected_events(node_id)
    started = time.monotonic()
    restarted = node.sh(f"systemctl restart {UNIT}")
    assert restarted.returncode == 0, restarted.stderr
    wait_until(lambda: connected_events(node_id) > connects, timeout=10, what="reconnect after systemctl restart")
    restart_s = time.monotonic() - started
    assert Node.objects.get(pk=node_id).status == "online"
    assert Node.objects.get(pk=node_id).connected
    assert node.unit_properties(UNIT, "MainPID")["MainPID"] != pid_before

    # Re-running the install script updates in place: same node, no second registration, a restart.
    agent_file = f"/opt/{UNIT}/venv/lib/python3.11/site-packages/agent/__init__.py"
    inode_before = node.sh(f"stat -c %i {agent_file}").stdout.strip()
    pid_before = node.unit_properties(UNIT, "MainPID")["MainPID"]
    connects = connected_events(node_id)
    update = run_as_operator(node, f"curl -fsSL {plane.url}/agent/install.sh | sh")
    assert update.returncode == 0, update.stdout + update.stderr
    assert "updating in place" in update.stdout
    assert "not joining again" in update.stdout
    assert json.loads(node.sh(f"cat {STATE}/node.json").stdout)["node_id"] == node_id
    assert list(Node.objects.filter(cluster=cluster).values_list("pk", flat=True)) == [registered.pk]
    assert JoinToken.objects.filter(cluster=cluster).count() == 1
    assert node.sh(f"stat -c %i {agent_file}").stdout.strip() != inode_before  # the agent was reinstalled
    wait_until(lambda: connected_events(node_id) > connects, timeout=15, what="reconnect after the update")
    assert node.unit_properties(UNIT, "MainPID")["MainPID"] != pid_before
    assert node.systemctl("is-active", UNIT) == "active"

    # Delete in the Nodes tab: the agent is told, stops, and systemd does not start it again.
    deleted = pages.click(f"/compute/nodes/{node_id}/delete/")
    assert deleted.status_code == 200, deleted.text[:500]
    assert not Node.objects.filter(pk=node_id).exists()
    wait_until(lambda: "not reconnecting" in node.journal(UNIT), timeout=15, what="the agent gave up")
    wait_until(lambda: node.systemctl("is-active", UNIT) == "failed", timeout=10, what="the agent exited")
    restarts = node.unit_properties(UNIT, "NRestarts")["NRestarts"]
    time.sleep(7)  # longer than the unit's RestartSec=5
    state = node.unit_properties(UNIT, "ActiveState", "ExecMainStatus", "NRestarts")
    assert state == {"ActiveState": "failed", "ExecMainStatus": "3", "NRestarts": restarts}, state
    journal = node.journal(UNIT)
    assert journal.count("not reconnecting") == 1, journal[-3000:]
    assert "remove the agent with: systemctl disable --now cleverthis-agent" in journal

    # ... and the docs' clean-up works.
    for step in ("stop", "disable"):
        done = node.sh(f"systemctl {step} {UNIT}")
        assert done.returncode == 0, done.stderr
    assert node.systemctl("is-enabled", UNIT) == "disabled"
    assert node.systemctl("is-active", UNIT) in ("inactive", "failed")

    print(f"\ninstall {install_s:.1f} s, systemctl restart → online {restart_s:.1f} s")


def one_error_line(done) -> str:
    """The failure's single stderr line (and a non-zero exit)."""
    assert done.returncode != 0, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_failed_installs_say_why_in_one_line(plane, pages, cluster, node_host):
    node = node_host
    join = pages.join_command(cluster)
    token = join.split("CLUSTER_TOKEN=")[1].split()[0]
    url = plane.url

    # Not root (and no sudo on this machine).
    line = one_error_line(node.sh(join, user="nobody"))
    assert f"run the installer as root: curl -fsSL {url}/agent/install.sh | sudo CLUSTER_TOKEN=<token> sh" in line

    # The control plane cannot be reached (the script came from elsewhere, e.g. a CDN or a saved copy).
    away = f"http://127.0.0.1:{free_port()}"
    elsewhere = join.replace("| CLUSTER_TOKEN=", f"| CONTROL_PLANE_URL={away} CLUSTER_TOKEN=")
    line = one_error_line(run_as_operator(node, elsewhere))
    assert line.startswith(f"error: cannot reach the control plane at {away} (curl: (7) "), line

    # Docker installed but not answering, and it cannot be started.
    line = one_error_line(run_as_operator(node, join, DOCKER_HOST="unix:///run/no-docker.sock"))
    assert line.startswith(
        "error: Docker does not answer 'docker info' and could not be started "
        "('systemctl enable --now docker' failed: Failed to enable unit: Unit file docker.service does not exist.): "
        "start the Docker daemon, or set SKIP_DOCKER=1 on Kubernetes and ArgoCD nodes"
    ), line

    # A wrong token, then an expired one: the control plane refuses; the agent is installed, not joined.
    wrong = join.replace(token, "ct_node_" + "x" * 43)
    line = one_error_line(run_as_operator(node, wrong))
    assert line.startswith(
        "error: joining the cluster failed: the control plane refused the join token: Unknown join token; "
        "a join token works once and expires 24 hours after it is made: generate a new one"
    ), line
    JoinToken.objects.filter(cluster=cluster).update(expires_at=JoinToken.objects.get().created_at)
    expired = run_as_operator(node, join)
    line = one_error_line(expired)
    assert line == (
        "error: joining the cluster failed: the control plane refused the join token: "
        "This join token has expired; generate a new one"
    ), line
    assert token not in expired.stdout + expired.stderr
    assert node.sh(f"test -e {STATE}/node.json").returncode != 0
    assert node.systemctl("is-enabled", UNIT) != "enabled"
    assert not Node.objects.exists()

    # A new token then joins this same machine.
    fresh = pages.join_command(cluster)
    joined = run_as_operator(node, fresh)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    wait_until(lambda: Node.objects.filter(status="online").count() == 1, timeout=30, what="node online")
    assert node.systemctl("is-active", UNIT) == "active"
