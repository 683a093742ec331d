"""`.ci/up`'s local demo node: the script it starts (`.ci/local-node`), run against a real web server and
Celery worker, joins this machine to the Demo workspace's "local" standalone cluster and the node comes
online; with Podman (root, as in CI) a container runs on the engine the script set up. Started again, it
is the same node (no second join).
"""

from __future__ import annotations

import io
import time
import uuid

import pytest
from django.core.management import call_command

from fleet import services
from fleet.models import Command, JoinToken, Node
from tests.agent.executors.podman import TEST_IMAGE, podman_url
from tests.support.live import stop_endpoint_servers
from tests.support.processes import REPO_ROOT, ManagedProcess, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def local_nodes():
    return Node.objects.filter(cluster__workspace__slug="demo", cluster__name="local")


def start_local_node(control_plane, tmp_path, name: str) -> ManagedProcess:
    env = {**control_plane.env, "CONTROL_PLANE_URL": control_plane.url, "LOCAL_NODE_DIR": str(tmp_path / "node")}
    return ManagedProcess(name, ["bash", str(REPO_ROOT / ".ci" / "local-node")], log_dir=tmp_path, env=env)


def wait_done(command: Command, timeout: float = 60) -> Command:
    wait_until(
        lambda: Command.objects.get(pk=command.pk).status in ("succeeded", "failed"), timeout=timeout, what="command"
    )
    return Command.objects.get(pk=command.pk)


def test_the_local_node_joins_the_demo_workspace_and_runs_containers(control_plane, tmp_path):
    call_command("bootstrap_demo", stdout=io.StringIO())  # as .ci/up does first
    script = start_local_node(control_plane, tmp_path, "local-node")
    container = f"local-node-test-{uuid.uuid4().hex[:8]}"
    try:
        started = time.monotonic()
        wait_until(
            lambda: local_nodes().filter(status="online").exists() or not script.alive(),
            timeout=60,
            what="the local node online",
        )
        assert script.alive(), script.log()
        online_after = time.monotonic() - started
        assert online_after < 30, (online_after, script.log())
        node = local_nodes().get()
        assert node.cluster.mode == "standalone"

        if podman_url() is not None:  # the engine .ci/podman-setup serves (CI runs as root)
            owner = node.cluster.workspace.memberships.get(role="owner").user
            (create,) = services.command_dispatch(
                actor=owner,
                cluster=node.cluster,
                node=node,
                command_type="container.create",
                payload={"image": TEST_IMAGE, "name": container, "command": ["sleep", "300"]},
            )
            assert wait_done(create).status == "succeeded", (create.pk, script.log()[-3000:])
            (destroy,) = services.command_dispatch(
                actor=owner,
                cluster=node.cluster,
                node=node,
                command_type="container.destroy",
                payload={"container": container, "timeout_s": 1},
            )
            assert wait_done(destroy).status == "succeeded"

        # Started again (as a second `.ci/up` would): the same node, no new join token.
        script.stop()
        tokens = JoinToken.objects.count()
        script = start_local_node(control_plane, tmp_path, "local-node-again")
        wait_until(lambda: Node.objects.get(pk=node.pk).connected, timeout=60, what="the same node reconnected")
        assert local_nodes().count() == 1
        assert JoinToken.objects.count() == tokens
    finally:
        script.stop()
        stop_endpoint_servers(tmp_path / "node")
        url = podman_url()
        if url is not None:  # whatever happened, no container of ours stays on the shared engine
            import docker

            client = docker.DockerClient(base_url=url)
            try:
                client.containers.get(container).remove(force=True)
            except docker.errors.NotFound:
                pass
            finally:
                client.close()
