"""Agent versions and updates on the control plane: the served package and its signature, node and
cluster updates through the API and the pages, automatic updates, and the outcome in the event log."""

from __future__ import annotations

import base64
import hashlib

import pytest

from agent import identity
from agent import protocol as p
from fleet import agent_packages, agent_updates, ca
from fleet.models import Command, Node, NodeEvent
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def package_cache(settings, tmp_path):
    settings.AGENT_PACKAGE_CACHE_DIR = str(tmp_path / "packages")


def _on_version(node: Node, version: str, protocol_version: int = p.PROTOCOL_VERSION) -> Node:
    Node.objects.filter(pk=node.pk).update(agent_version=version, protocol_version=protocol_version)
    node.refresh_from_db()
    return node


def test_the_served_package_is_signed_by_the_ca_and_reproducible(tmp_path, settings):
    package = agent_packages.served_package()
    assert package.version == agent_packages.served_version()
    assert hashlib.sha256(package.path.read_bytes()).hexdigest() == package.sha256
    signature = agent_packages.package_signature(package)
    ca_pem = ca.ca_certificate_pem()
    assert identity.verify_package_signature(ca_pem, package.version, package.sha256, signature)
    assert not identity.verify_package_signature(ca_pem, package.version, "0" * 64, signature)
    assert not identity.verify_package_signature(ca_pem, package.version + "x", package.sha256, signature)
    # a second build (another replica) serves the very same bytes, so the one signed digest holds
    settings.AGENT_PACKAGE_CACHE_DIR = str(tmp_path / "other-replica")
    agent_packages._built.clear()
    assert agent_packages.served_package().sha256 == package.sha256
    forged = base64.b64encode(b"x" * 64).decode()
    assert not identity.verify_package_signature(ca_pem, package.version, package.sha256, forged)


def test_node_api_shows_the_agent_version_and_whether_it_is_current(api_client_for, owner, node):
    api = api_client_for(owner)
    _on_version(node, "0.0.1+old")
    body = api.get(f"/api/v1/nodes/{node.pk}/").json()
    assert body["agent_version"] == "0.0.1+old"
    assert body["agent_current"] is False
    assert body["agent_version_current"] == agent_packages.served_version()
    assert body["protocol_version"] == p.PROTOCOL_VERSION
    _on_version(node, agent_packages.served_version())
    assert api.get(f"/api/v1/nodes/{node.pk}/").json()["agent_current"] is True


def test_update_one_node_sends_a_signed_agent_update_and_logs_it(api_client_for, owner, node, settings):
    api = api_client_for(owner)
    _on_version(node, "0.0.1+old")
    response = api.post(f"/api/v1/nodes/{node.pk}/update-agent/")
    assert response.status_code == 202, response.content
    command = Command.objects.get(pk=response.json()["id"])
    assert command.command_type == "agent.update"
    payload = p.parse_payload("agent.update", command.payload)
    assert payload.version == agent_packages.served_version()
    assert payload.rollback_after_s == settings.AGENT_UPDATE_ROLLBACK_S
    assert identity.verify_package_signature(
        ca.ca_certificate_pem(), payload.version, payload.sha256, payload.signature_b64
    )
    assert NodeEvent.objects.filter(node=node, kind="agent.update", command=command).exists()
    # one at a time
    again = api.post(f"/api/v1/nodes/{node.pk}/update-agent/")
    assert again.status_code == 409
    assert "already under way" in again.json()["detail"]


def test_update_is_refused_for_a_current_agent_an_agent_too_old_and_a_viewer(
    api_client_for, owner, node, member_of, workspace
):
    api = api_client_for(owner)
    _on_version(node, agent_packages.served_version())
    assert api.post(f"/api/v1/nodes/{node.pk}/update-agent/").status_code == 409
    _on_version(node, "0.0.1", protocol_version=1)
    refused = api.post(f"/api/v1/nodes/{node.pk}/update-agent/")
    assert refused.status_code == 409
    assert "re-run the install script" in refused.json()["detail"]
    _on_version(node, "0.0.1+old")
    viewer = api_client_for(member_of(workspace, "viewer"))
    assert viewer.post(f"/api/v1/nodes/{node.pk}/update-agent/").status_code == 403
    assert not Command.objects.filter(node=node).exists()


def test_update_a_cluster_and_turn_on_automatic_updates(api_client_for, owner, cluster, node, register_node):
    api = api_client_for(owner)
    current = _on_version(register_node(cluster, "current-box"), agent_packages.served_version())
    _on_version(node, "0.0.1+old")
    response = api.post(f"/api/v1/clusters/{cluster.pk}/update-agents/")
    assert response.status_code == 202
    assert [c["node"] for c in response.json()["commands"]] == [str(node.pk)]
    assert not Command.objects.filter(node=current).exists()

    assert (
        api.patch(f"/api/v1/clusters/{cluster.pk}/", {"auto_update_agents": False}, format="json").json()[
            "auto_update_agents"
        ]
        is False
    )
    Command.objects.all().delete()
    assert agent_updates.node_auto_update(node=node) is None
    api.patch(f"/api/v1/clusters/{cluster.pk}/", {"auto_update_agents": True}, format="json")
    command = agent_updates.node_auto_update(node=node)
    assert command is not None
    assert command.created_by is None
    assert agent_updates.node_auto_update(node=node) is None  # already under way


def test_a_node_deleted_while_its_tunnel_says_hello_gets_no_automatic_update(cluster, node):
    """The tunnel's hello checks for an update after its welcome; a delete may land in between."""
    cluster.auto_update_agents = True
    cluster.save(update_fields=["auto_update_agents"])
    _on_version(node, "0.0.1+old")
    stale = Node.objects.get(pk=node.pk)
    Node.objects.filter(pk=node.pk).delete()
    assert agent_updates.node_auto_update(node=stale) is None


def test_the_outcome_lands_in_the_event_log(owner, node):
    _on_version(node, "0.0.1+old")
    done = agent_updates.node_update_agent(node=node, actor=owner)
    agent_side.result(done, version="0.2.0+new", previous_version="0.0.1+old", seconds=3.5)
    event = NodeEvent.objects.get(node=node, kind="agent.updated")
    assert "0.0.1+old → 0.2.0+new" in event.message
    failed = agent_updates.node_update_agent(node=node, actor=owner)
    agent_side.error(failed, "internal", "agent 0.2.0+new did not connect in time: rolled back to 0.0.1+old")
    assert "rolled back" in NodeEvent.objects.get(node=node, kind="agent.update_failed").message


def test_the_nodes_page_shows_the_agent_state_and_updates_one_node(client, owner, cluster, node):
    client.force_login(owner)
    _on_version(node, "0.0.1+old")
    page = client.get(f"/compute/clusters/{cluster.pk}/nodes/").content.decode()
    assert "0.0.1+old" in page
    assert "update available" in page
    response = client.post(f"/compute/nodes/{node.pk}/update-agent/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert "Agent update of" in response.content.decode()
    assert Command.objects.filter(node=node, command_type="agent.update").count() == 1
    _on_version(node, agent_packages.served_version())
    detail = client.get(f"/compute/nodes/{node.pk}/").content.decode()
    assert "(current)" in detail
