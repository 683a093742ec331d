"""Node pages update themselves: the Nodes table and the node's header, facts and event log."""

from __future__ import annotations

import pytest

from fleet import services
from fleet.models import Command, CommandStatus, Node, NodeStatus

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def browser(client, owner):
    client.force_login(owner)
    return client


def test_node_page_polls_fast_while_a_command_runs_then_watches_heartbeats(browser, owner, cluster, node):
    url = f"/compute/nodes/{node.pk}/"
    page = browser.get(url).content.decode()
    assert f'id="node-facts" hx-get="{url}?part=facts" hx-trigger="every 30s"' in page
    assert f'id="events" hx-get="{url}" hx-trigger="every 30s"' in page
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
    )
    facts = browser.get(f"{url}?part=facts", **HX).content.decode()
    assert facts.lstrip().startswith('<div id="node-facts" hx-get=')
    assert 'hx-trigger="every 3s"' in facts
    assert "<html" not in facts
    events = browser.get(url, **HX).content.decode()
    assert 'hx-trigger="every 3s"' in events
    assert "model.download queued by owner" in events
    Command.objects.filter(pk=command.pk).update(status=CommandStatus.SUCCEEDED)
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.OFFLINE, connected=False)
    facts = browser.get(f"{url}?part=facts", **HX).content.decode()
    assert 'data-status="offline"' in facts
    assert 'hx-trigger="every 30s"' in facts


def test_nodes_table_polls_fast_while_a_node_drains(browser, owner, cluster, node):
    url = f"/compute/clusters/{cluster.pk}/nodes/"
    assert 'hx-trigger="every 30s"' in browser.get(url).content.decode()
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.DRAINING)
    partial = browser.get(url, **HX).content.decode()
    assert f'id="nodes" hx-get="{url}" hx-trigger="every 3s"' in partial
