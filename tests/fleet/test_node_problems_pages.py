"""A node whose agent cannot run containers (issue 35: a kubernetes node without credentials showed Online
with 0 containers and no warning): the Nodes list and the node page warn with the documents' fix, and the
node's event log says when it started and when it was fixed."""

from __future__ import annotations

import pytest

from agent import protocol
from fleet import services
from fleet.models import Node, NodeEvent

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}
NO_CREDENTIALS = protocol.InventoryProblem(
    part="containers",
    code="kubernetes_unavailable",
    message="cannot load Kubernetes credentials (in-cluster configuration): Service host/port is not set.",
)


@pytest.fixture
def browser(client, owner):
    client.force_login(owner)
    return client


@pytest.fixture
def kube_node(owner, workspace, register_node):
    cluster = services.cluster_create(actor=owner, workspace=workspace, name="k8s", mode="kubernetes")
    return register_node(cluster, "kube-1")


def test_kubernetes_node_without_credentials_warns_with_the_fix_then_clears(browser, kube_node):
    node = kube_node
    services.node_record_inventory(node=node, inventory=protocol.Inventory(problems=[NO_CREDENTIALS]))
    node.refresh_from_db()
    assert node.status == "online"  # the agent is connected: it stays online, with a warning

    listing = browser.get(f"/compute/clusters/{node.cluster_id}/nodes/").content.decode()
    assert 'title="The agent cannot reach the Kubernetes API: containers cannot run on this node."' in listing
    assert f'⚠ No Kubernetes API: <a href="/compute/nodes/{node.pk}/#node-problems">how to fix</a>' in listing

    page = browser.get(f"/compute/nodes/{node.pk}/").content.decode()
    assert 'id="node-problems" class="banner warning" role="alert"' in page
    assert "Service host/port is not set." in page  # the agent's own reason
    assert "CLEVERTHIS_KUBECONFIG" in page
    assert "~/.kube/config" in page
    assert "kubectl create serviceaccount cleverthis-agent -n kube-system" in page
    assert "systemctl restart cleverthis-agent" in page
    facts = browser.get(f"/compute/nodes/{node.pk}/?part=facts", **HX).content.decode()  # the live part has it
    assert 'id="node-problems"' in facts

    [event] = NodeEvent.objects.filter(node=node, kind="agent.problem")
    assert "cannot reach the Kubernetes API" in event.message
    assert "Service host/port is not set" in event.message
    services.node_record_inventory(node=node, inventory=protocol.Inventory(problems=[NO_CREDENTIALS]))
    assert NodeEvent.objects.filter(node=node, kind="agent.problem").count() == 1  # reported once

    services.node_record_inventory(node=node, inventory=protocol.Inventory())  # credentials fixed
    assert NodeEvent.objects.filter(node=node, kind="agent.problem_resolved").count() == 1
    assert "node-problems" not in browser.get(f"/compute/nodes/{node.pk}/").content.decode()
    listing = browser.get(f"/compute/clusters/{node.cluster_id}/nodes/").content.decode()
    assert "how to fix" not in listing


def test_an_offline_node_shows_offline_not_its_last_problems(browser, kube_node):
    services.node_record_inventory(node=kube_node, inventory=protocol.Inventory(problems=[NO_CREDENTIALS]))
    Node.objects.filter(pk=kube_node.pk).update(connected=False, status="offline")
    assert "node-problems" not in browser.get(f"/compute/nodes/{kube_node.pk}/").content.decode()


def test_docker_not_running_on_a_standalone_node_says_so(browser, node):
    problem = protocol.InventoryProblem(
        part="containers", code="docker_unavailable", message="Docker engine not reachable: connection refused"
    )
    services.node_record_inventory(node=node, inventory=protocol.Inventory(problems=[problem]))
    page = browser.get(f"/compute/nodes/{node.pk}/").content.decode()
    assert "The agent cannot reach Docker" in page
    assert "docker info" in page
