"""Node changes pushed to signed-in browsers: the /ws/live/ socket on the session stack, one group per
workspace, over the real Redis channel layer (Channels' WebsocketCommunicator against the ASGI app)."""

from __future__ import annotations

import datetime as dt

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from cleverthis import consumers
from cleverthis.asgi import application
from cleverthis.routing import agent_websocket_urlpatterns, user_websocket_urlpatterns
from fleet import browser_push, services
from fleet.models import Node, NodeStatus
from tenancy import services as tenancy
from tenancy.models import Role

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ORIGIN = (b"origin", b"http://127.0.0.1:8000")


def _session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def _tab(user=None) -> WebsocketCommunicator:
    headers = [ORIGIN]
    if user is not None:
        headers.append((b"cookie", await database_sync_to_async(_session_cookie)(user)))
    tab = WebsocketCommunicator(application, "/ws/live/", headers=headers)
    connected, _ = await tab.connect()
    assert connected
    return tab


async def test_a_signed_in_tab_hears_each_change_of_its_workspace_once(owner, cluster, register_node):
    node = await database_sync_to_async(register_node)(cluster, "box")
    tabs = [await _tab(owner), await _tab(owner)]  # two tabs of one user: each hears it, once
    try:
        await database_sync_to_async(services.node_cordon)(node=node, actor=owner)
        for tab in tabs:
            heard = await tab.receive_json_from(timeout=5)
            assert heard == {"type": "nodes", "nodes": [str(node.pk)], "clusters": [str(cluster.pk)]}
            assert await tab.receive_nothing(timeout=0.3)
        await database_sync_to_async(services.node_drain)(node=node, actor=owner)  # no containers: → cordoned
        assert (await tabs[0].receive_json_from(timeout=5))["nodes"] == [str(node.pk)]
    finally:
        for tab in tabs:
            await tab.disconnect()


async def test_lost_nodes_are_one_message_per_workspace(owner, cluster, register_node, settings):
    nodes = [await database_sync_to_async(register_node)(cluster, f"box-{i}") for i in range(3)]
    silent_since = timezone.now() - dt.timedelta(seconds=settings.NODE_OFFLINE_AFTER_S + 5)
    await database_sync_to_async(lambda: Node.objects.update(last_heartbeat_at=silent_since))()
    tab = await _tab(owner)
    try:
        assert await database_sync_to_async(services.nodes_mark_lost_offline)() == 3
        heard = await tab.receive_json_from(timeout=5)
        assert heard["nodes"] == sorted(str(n.pk) for n in nodes)
        assert await tab.receive_nothing(timeout=0.3)  # the whole pass: one message
        assert await database_sync_to_async(lambda: set(Node.objects.values_list("status", flat=True)))() == {
            NodeStatus.OFFLINE
        }
    finally:
        await tab.disconnect()


async def test_presence_changes_are_pushed_too(owner, cluster, register_node):
    node = await database_sync_to_async(register_node)(cluster, "box")
    tab = await _tab(owner)
    try:
        node = await database_sync_to_async(Node.objects.select_related("cluster").get)(pk=node.pk)
        await database_sync_to_async(services.node_disconnected)(node=node)  # "reconnecting…" on the pages
        assert (await tab.receive_json_from(timeout=5))["nodes"] == [str(node.pk)]
        await database_sync_to_async(services.node_delete)(node=node, actor=owner)
        assert (await tab.receive_json_from(timeout=5))["nodes"] == [str(node.pk)]
    finally:
        await tab.disconnect()


async def test_members_of_other_workspaces_hear_nothing_and_visitors_are_refused(
    owner, cluster, other_cluster, register_node
):
    node = await database_sync_to_async(register_node)(cluster, "box")
    stranger = await database_sync_to_async(lambda: other_cluster.workspace.memberships.get().user)()
    theirs = await _tab(stranger)
    try:
        await database_sync_to_async(services.node_cordon)(node=node, actor=owner)
        assert await theirs.receive_nothing(timeout=0.5)
    finally:
        await theirs.disconnect()
    visitor = WebsocketCommunicator(application, "/ws/live/", headers=[ORIGIN])
    connected, code = await visitor.connect()
    assert not connected
    assert code == 4401
    await visitor.disconnect()


async def test_renew_reads_the_memberships_again(owner, cluster, other_cluster, register_node, monkeypatch):
    monkeypatch.setattr(consumers, "LIVE_RENEW_S", 0.0)
    theirs = await database_sync_to_async(register_node)(other_cluster, "their-box")
    their_owner = await database_sync_to_async(lambda: other_cluster.workspace.memberships.get().user)()
    tab = await _tab(owner)
    try:
        await database_sync_to_async(tenancy.membership_set)(
            workspace=other_cluster.workspace, user=owner, role=Role.VIEWER
        )
        await tab.send_json_to({"type": "renew"})
        await tab.receive_nothing(timeout=0.3)  # (the renew is handled)
        await database_sync_to_async(services.node_cordon)(node=theirs, actor=their_owner)
        assert (await tab.receive_json_from(timeout=5))["clusters"] == [str(other_cluster.pk)]
    finally:
        await tab.disconnect()


async def test_the_browser_socket_is_apart_from_the_agent_tunnel():
    assert all("ws/live" not in p.pattern.regex.pattern for p in agent_websocket_urlpatterns)
    assert any(p.pattern.regex.pattern == r"^ws/live/$" for p in user_websocket_urlpatterns)
    message = browser_push.nodes_message(workspace_id="w", node_ids=["n2", "n1", "n1"], cluster_ids=["c"])
    assert message == {"type": "browser.nodes", "workspace": "w", "nodes": ["n1", "n2"], "clusters": ["c"]}


async def test_a_removed_member_stops_hearing_the_workspace_at_once(owner, member_of, cluster, register_node):
    """No renew needed: the removal makes the member's open tabs leave the workspace's group."""
    node = await database_sync_to_async(register_node)(cluster, "box")
    member = await database_sync_to_async(member_of)(cluster.workspace, "viewer")
    tab, owners = await _tab(member), await _tab(owner)
    try:
        await database_sync_to_async(services.node_cordon)(node=node, actor=owner)
        assert (await tab.receive_json_from(timeout=5))["nodes"] == [str(node.pk)]
        await owners.receive_json_from(timeout=5)
        await database_sync_to_async(tenancy.membership_remove)(workspace=cluster.workspace, user=member)
        await tab.receive_nothing(timeout=0.3)  # (the leave is handled)
        await database_sync_to_async(services.node_drain)(node=node, actor=owner)
        assert (await owners.receive_json_from(timeout=5))["nodes"] == [str(node.pk)]  # it was sent
        assert await tab.receive_nothing(timeout=0.5)  # and the removed member's tab did not get it
    finally:
        await tab.disconnect()
        await owners.disconnect()


@pytest.mark.parametrize(
    "origin", ["http://endpoint-0123456789ab.endpoints.localhost:8000", "http://ray-7.ray.localhost"]
)
async def test_a_signed_in_tab_on_a_node_origin_cannot_open_the_live_socket(owner, origin, settings):
    settings.ENDPOINT_DOMAIN, settings.RAY_DASHBOARD_DOMAIN = "endpoints.localhost", "ray.localhost"
    cookie = await database_sync_to_async(_session_cookie)(owner)
    tab = WebsocketCommunicator(application, "/ws/live/", headers=[(b"origin", origin.encode()), (b"cookie", cookie)])
    connected, _ = await tab.connect()
    assert not connected
    await tab.disconnect()
