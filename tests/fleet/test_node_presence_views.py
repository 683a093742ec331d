"""Offline nodes in the Nodes table, on the node page and in the API: "last seen", no stale figures."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.utils import timezone

from agent import protocol
from fleet import services
from fleet.models import Node, NodeStatus
from fleet.templatetags.fleet_tags import ago

pytestmark = pytest.mark.django_db

BEAT = protocol.Heartbeat(
    cpu_percent=37.0,
    memory_percent=41.0,
    memory_used_mb=26000,
    memory_total_mb=64000,
    gpus=[
        protocol.GpuInfo(
            index=0, name="NVIDIA H100", memory_total_mb=80000, memory_used_mb=20000, utilization_percent=73.0
        )
    ],
)


@pytest.fixture
def beating(cluster, register_node) -> Node:
    node = register_node(cluster)
    services.node_record_heartbeats(beats=[(node.pk, BEAT)])
    return node


def _go_offline(node: Node, seen_ago_s: int = 125) -> None:
    """As the lost-nodes pass leaves it: tunnel closed, offline, last heard from `seen_ago_s` ago."""
    now = timezone.now()
    Node.objects.filter(pk=node.pk).update(
        connected=False,
        status=NodeStatus.OFFLINE,
        disconnected_at=now - dt.timedelta(seconds=seen_ago_s - 1),
        last_heartbeat_at=now - dt.timedelta(seconds=seen_ago_s),
    )


def _row(page: str, node: Node) -> str:
    return re.search(rf'<tr id="node-{node.pk}">(.*?)</tr>', page, re.S).group(1)


def test_ago():
    now = timezone.now()
    assert ago(None) == "never"
    assert ago(now - dt.timedelta(seconds=12)) == "12 s ago"
    assert ago(now - dt.timedelta(seconds=125)) == "2 min ago"
    assert ago(now - dt.timedelta(hours=5, minutes=3)) == "5 h ago"
    assert ago(now - dt.timedelta(days=1, hours=2)) == "1 day ago"
    assert ago(now - dt.timedelta(days=3)) == "3 days ago"
    assert ago(now + dt.timedelta(seconds=3)) == "0 s ago"  # clocks of two processes


def _without_sparklines(html: str) -> str:
    return re.sub(r'<span class="spark"[^>]*></span>', "", html)


def test_nodes_table_online_shows_figures_offline_shows_last_seen_and_no_figures(client, owner, cluster, beating):
    client.force_login(owner)
    url = f"/compute/clusters/{cluster.pk}/nodes/"
    row = _row(client.get(url).content.decode(), beating)
    assert "37%" in row
    assert "41%" in row
    assert "73%" in row
    assert "last seen" not in row

    _go_offline(beating)
    row = _row(client.get(url).content.decode(), beating)
    assert "last seen 2 min ago" in row
    assert "Offline" in row
    figures = _without_sparklines(row)  # the sparklines keep the last hour's history ("latest 37%")
    for stale in ("37%", "41%", "73%", "25.4 /", "19.5 /"):
        assert stale not in figures, stale
    assert "16 cores" in row
    assert "NVIDIA H100" in row


def test_nodes_table_during_the_grace_says_reconnecting(client, owner, cluster, beating):
    client.force_login(owner)
    services.node_disconnected(node=beating)
    row = _row(client.get(f"/compute/clusters/{cluster.pk}/nodes/").content.decode(), beating)
    assert "Online" in row
    assert "reconnecting" in row
    assert "37%" not in _without_sparklines(row)


def test_node_page_offline_shows_last_seen_no_figures_and_the_status_history(client, owner, cluster, beating):
    client.force_login(owner)
    services.node_disconnected(node=beating)
    Node.objects.filter(pk=beating.pk).update(disconnected_at=timezone.now() - dt.timedelta(seconds=60))
    services.nodes_mark_lost_offline()
    Node.objects.filter(pk=beating.pk).update(last_heartbeat_at=timezone.now() - dt.timedelta(minutes=3, seconds=5))
    page = client.get(f"/compute/nodes/{beating.pk}/").content.decode()
    assert "last seen 3 min ago" in page
    assert "tunnel closed 1 min ago" in page
    facts = page[page.index('id="node-facts"') : page.index('id="utilization"')]
    for stale in ("37%", "41%", "73%"):  # not shown as current (the charts below keep the last hour's history)
        assert stale not in facts, stale
    assert "now 37%" not in page
    assert "latest 37%" in page
    assert "Tunnel closed" in page
    assert "status → offline" in page


def test_api_offline_node_has_last_seen_and_null_figures(api_client_for, owner, beating):
    api = api_client_for(owner)
    live = api.get(f"/api/v1/nodes/{beating.pk}/").json()
    assert (live["cpu_percent"], live["memory_percent"], live["gpu_utilization_percent"]) == (37.0, 41.0, 73.0)
    assert live["gpus"][0]["utilization_percent"] == 73.0
    assert live["last_seen"] is not None
    assert live["disconnected_at"] is None

    _go_offline(beating)
    body = api.get(f"/api/v1/nodes/{beating.pk}/").json()
    assert body["status"] == "offline"
    node = Node.objects.get(pk=beating.pk)
    assert dt.datetime.fromisoformat(body["last_seen"].replace("Z", "+00:00")) == node.last_heartbeat_at
    assert body["disconnected_at"] is not None
    for field in ("cpu_percent", "memory_percent", "memory_used_mb", "vram_used_mb", "gpu_utilization_percent"):
        assert body[field] is None, field
    assert body["gpus"][0]["utilization_percent"] is None
    assert body["gpus"][0]["memory_used_mb"] is None
    assert body["gpus"][0]["memory_total_mb"] == 80000
    assert (body["cpu_count"], body["memory_total_mb"], body["vram_total_mb"]) == (16, 64000, 80000)
    listed = api.get("/api/v1/nodes/").json()["results"]
    assert [n["cpu_percent"] for n in listed] == [None]
