"""Fixtures for end-to-end tests: a live control plane, a workspace with a cluster, agents, a Hub stand-in."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from agent.ray.process_runtime import RayNodeProcess, RayProcessRuntime
from fleet import services
from fleet.models import Node
from tests.support.hub_standin import HubStandin
from tests.support.live import ControlPlane, agent_join, agent_run, stop_endpoint_servers, subprocess_env
from tests.support.processes import BOTH_SERVERS, VENV_BIN, wait_until
from tests.support.ray_docker import ray_container_env, remove_containers

# A test that takes `control_plane` and must pass on production's server and development's, each.
both_servers = pytest.mark.parametrize("control_plane", BOTH_SERVERS, indirect=True)


@pytest.fixture
def operator():
    from tenancy import services as tenancy

    user = get_user_model().objects.create_user("ops", password="pw-ops")
    workspace = tenancy.workspace_create(name="E2E", owner=user)
    return user, workspace


@pytest.fixture
def cluster(operator):
    user, workspace = operator
    return services.cluster_create(actor=user, workspace=workspace, name="lab", mode="standalone")


@pytest.fixture
def hub():
    standin = HubStandin().start()
    standin.add_repo("acme/tiny", {"config.json": b'{"layers": 1}', "weights.bin": b"w" * 4096})
    yield standin
    standin.stop()


@pytest.fixture
def control_plane(request, tmp_path, settings):
    """One web replica and a Celery worker; the replica runs the server a test names through indirect
    parametrization (`@both_servers`), else the default one (`processes.default_server()`)."""
    settings.NODE_OFFLINE_AFTER_S = 3
    server = getattr(request, "param", None)
    plane = ControlPlane(log_dir=tmp_path, env=subprocess_env(NODE_OFFLINE_AFTER_S="3"), server=server)
    plane.start_replica()
    plane.start_worker()
    yield plane
    plane.stop()


@pytest.fixture
def agents(tmp_path, hub):
    started = []
    states = []

    def start(control_plane: ControlPlane, cluster, operator_user, name: str, *, url=None, extra_env=None):
        _, raw = services.join_token_create(cluster=cluster, actor=operator_user)
        state = tmp_path / f"state-{name}"
        states.append(state)
        joined = agent_join(url or control_plane.url, raw, state)
        assert joined.returncode == 0, joined.stderr
        env = {"CLEVERTHIS_MODEL_CACHE": str(tmp_path / f"models-{name}"), "HF_ENDPOINT": hub.url, **(extra_env or {})}
        proc = agent_run(state, tmp_path, name=f"agent-{name}", env=env)
        started.append(proc)
        return proc, state, env

    yield start
    for proc in started:
        proc.stop()
    for state in states:  # what the agents started in sessions of its own (endpoint servers)
        stop_endpoint_servers(state)


def node_of(state: Path) -> Node:
    return Node.objects.get(pk=json.loads((state / "node.json").read_text())["node_id"])


def wait_status(node: Node, status: str, timeout: float = 20) -> None:
    wait_until(lambda: Node.objects.get(pk=node.pk).status == status, timeout=timeout, what=f"node {status}")


@pytest.fixture
def no_leftover_ray(tmp_path):
    """Whatever happens, stop the Ray processes the agents started (never a machine-wide `ray stop`)."""
    yield
    for members in tmp_path.glob("state-*/work/ray/ray-members.json"):
        runtime = RayProcessRuntime(VENV_BIN / "ray", members.parent)
        for data in json.loads(members.read_text() or "{}").values():
            with contextlib.suppress(Exception):
                runtime.stop(RayNodeProcess(**data))


@pytest.fixture
def docker_env():
    """(agent env for Ray containers, list to append Ray cluster ids to): their containers go at teardown."""
    made: list[str] = []
    yield ray_container_env(), made
    remove_containers(made)
