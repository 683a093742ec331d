"""Agent self-update end to end: real web server, Celery worker, PostgreSQL, Redis and agent processes.

The control plane serves a package built from a copy of this checkout's agent (AGENT_PACKAGE_SOURCE_DIR)
that differs from the running agent, so it is a newer version; the agent downloads it from the control
plane, checks the CA's signature over its digest, installs it beside itself, re-executes into it and
confirms once connected. A package whose agent cannot reach the tunnel is rolled back.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from django.db import transaction

from agent.install import package_version
from agent.update.version import agent_version
from fleet import agent_updates, services
from fleet.models import Command, Node, NodeEvent
from tests.e2e.conftest import node_of, wait_status
from tests.support.live import ControlPlane, subprocess_env
from tests.support.processes import REPO_ROOT, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _source_tree(target: Path, *, change: tuple[str, str, str]) -> Path:
    """A copy of the checkout's package inputs with one edit: (file under agent/, old text, new text)."""
    target.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, target / name)
    shutil.copytree(REPO_ROOT / "agent", target / "agent", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    path, old, new = change
    text = (target / "agent" / path).read_text()
    assert old in text
    (target / "agent" / path).write_text(text.replace(old, new, 1))
    return target


def _plane(tmp_path: Path, settings, source: Path) -> ControlPlane:
    settings.NODE_OFFLINE_AFTER_S = 3
    settings.AGENT_PACKAGE_SOURCE_DIR = str(source)
    settings.AGENT_PACKAGE_CACHE_DIR = str(tmp_path / "package-cache")
    settings.AGENT_UPDATE_ROLLBACK_S = 20.0
    env = subprocess_env(
        NODE_OFFLINE_AFTER_S="3",
        AGENT_PACKAGE_SOURCE_DIR=str(source),
        AGENT_PACKAGE_CACHE_DIR=str(tmp_path / "package-cache"),
        AGENT_UPDATE_ROLLBACK_S="20",
    )
    plane = ControlPlane(log_dir=tmp_path, env=env)
    plane.start_replica()
    plane.start_worker()
    return plane


@pytest.fixture
def newer_plane(tmp_path, settings):
    source = _source_tree(tmp_path / "newer", change=("__init__.py", '"""', '"""A newer agent. '))
    plane = _plane(tmp_path, settings, source)
    yield plane, package_version(source)
    plane.stop()


@pytest.fixture
def broken_plane(tmp_path, settings):
    # This version's agent dials a path the control plane does not serve: it can never connect.
    change = ("transport/tunnel.py", 'url = f"{self.config.tunnel_url}?', 'url = f"{self.config.tunnel_url}-gone?')
    source = _source_tree(tmp_path / "broken", change=change)
    plane = _plane(tmp_path, settings, source)
    yield plane, package_version(source)
    plane.stop()


def _manual_updates(cluster):
    cluster.auto_update_agents = False
    cluster.save(update_fields=["auto_update_agents"])


def _journal_keys(state: Path) -> list[str]:
    lines = (state / "work" / "journal.jsonl").read_text().splitlines()
    return [json.loads(line)["key"] for line in lines if line.strip()]


def test_update_to_a_newer_package_brings_the_node_back_on_the_new_version(newer_plane, cluster, operator, agents):
    plane, new_version = newer_plane
    user, _ = operator
    _manual_updates(cluster)
    proc, state, _ = agents(plane, cluster, user, "u")
    node = node_of(state)
    wait_status(node, "online", timeout=60)
    node.refresh_from_db()
    assert node.agent_version == agent_version() != new_version
    assert not agent_updates.is_current(node)

    started = time.monotonic()
    update = agent_updates.node_update_agent(node=node, actor=user)
    # a command sent while the update is under way runs exactly once, on one version or the other
    (download,) = services.command_dispatch(
        actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
    )
    wait_until(lambda: Command.objects.get(pk=update.pk).status in ("succeeded", "failed"), timeout=180, what="update")
    wait_until(lambda: Node.objects.get(pk=node.pk).agent_version == new_version, timeout=60, what="new version")
    elapsed = time.monotonic() - started
    update.refresh_from_db()
    assert update.status == "succeeded", (update.error_message, proc.log()[-4000:])
    node.refresh_from_db()
    assert node.connected
    assert node.status == "online"
    assert agent_updates.is_current(node)
    print(
        f"\nagent update: command → node online on {new_version} in {elapsed:.1f}s "
        f"(agent's own measure {update.result.get('seconds')}s)"
    )

    wait_until(
        lambda: Command.objects.get(pk=download.pk).status in ("succeeded", "failed"), timeout=120, what="download"
    )
    assert Command.objects.get(pk=download.pk).status == "succeeded"
    keys = _journal_keys(state)
    assert keys.count(download.idempotency_key) == 1
    assert keys.count(update.idempotency_key) == 1
    assert (state / "versions" / new_version / "agent" / "_version.py").is_file()
    assert NodeEvent.objects.filter(node=node, kind="agent.updated", message__contains=new_version).exists()
    assert "restarting into it" in proc.log()


def test_a_package_whose_agent_cannot_connect_is_rolled_back(broken_plane, cluster, operator, agents):
    plane, broken_version = broken_plane
    user, _ = operator
    _manual_updates(cluster)
    proc, state, _ = agents(plane, cluster, user, "r")
    node = node_of(state)
    wait_status(node, "online", timeout=60)
    before = Node.objects.get(pk=node.pk).agent_version

    started = time.monotonic()
    update = agent_updates.node_update_agent(node=node, actor=user)
    wait_until(
        lambda: Command.objects.get(pk=update.pk).status in ("succeeded", "failed"), timeout=240, what="rollback"
    )
    print(f"\nagent rollback: command → update reported failed (rolled back) in {time.monotonic() - started:.1f}s")
    update.refresh_from_db()
    assert update.status == "failed", proc.log()[-4000:]
    assert "rolled back" in update.error_message
    node.refresh_from_db()
    assert node.agent_version == before
    wait_until(lambda: Node.objects.get(pk=node.pk).connected, timeout=60, what="previous version reconnected")
    failed = NodeEvent.objects.get(node=node, kind="agent.update_failed")
    assert "rolled back" in failed.message
    assert broken_version in failed.message
    assert not (state / "versions" / "current").exists()


def test_a_package_whose_digest_is_not_signed_is_refused(newer_plane, cluster, operator, agents):
    plane, _ = newer_plane
    user, _ = operator
    _manual_updates(cluster)
    _proc, state, _ = agents(plane, cluster, user, "s")
    node = node_of(state)
    wait_status(node, "online", timeout=60)
    # whoever could swap the download or the payload cannot produce the CA's signature over its digest
    with transaction.atomic():  # tampered before it is sent (dispatch follows the commit)
        update = agent_updates.node_update_agent(node=node, actor=user)
        Command.objects.filter(pk=update.pk).update(payload={**update.payload, "sha256": "0" * 64})
    wait_until(lambda: Command.objects.get(pk=update.pk).status in ("succeeded", "failed"), timeout=120, what="refusal")
    update.refresh_from_db()
    assert update.status == "failed"
    assert "signature" in update.error_message
    assert Node.objects.get(pk=node.pk).agent_version == agent_version()
    assert not (state / "versions" / "current").exists()


def test_a_cluster_with_automatic_updates_updates_a_node_when_it_connects(newer_plane, cluster, operator, agents):
    plane, new_version = newer_plane
    user, _ = operator
    assert cluster.auto_update_agents  # the default
    proc, state, _ = agents(plane, cluster, user, "auto")
    node = node_of(state)
    wait_until(lambda: Node.objects.get(pk=node.pk).agent_version == new_version, timeout=180, what="automatic update")
    update = Command.objects.get(node=node, command_type="agent.update")
    assert update.created_by is None
    wait_until(lambda: Command.objects.get(pk=update.pk).status == "succeeded", timeout=60, what="update recorded")
    assert NodeEvent.objects.filter(node=node, kind="agent.update", message__contains="automatic").exists()
    assert "restarting into it" in proc.log()
