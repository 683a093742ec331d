"""Compute pages: every rule through at least one page, full pages and htmx partials."""

from __future__ import annotations

import re

import pytest

from fleet import services
from fleet.models import Command, ComputeCluster, JoinToken, Node, NodeStatus, RevokedSerial
from fleet.payloads import MASK

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def browser(client, owner):
    client.force_login(owner)
    return client


def test_cluster_list_and_create(browser, workspace):
    page = browser.get("/compute/")
    assert page.status_code == 200
    assert b"No compute clusters yet." in page.content
    assert b"Create Cluster" in page.content
    response = browser.post(
        "/compute/", {"workspace": str(workspace.pk), "name": "edge", "mode": "kubernetes", "git_branch": "main"}
    )
    assert response.status_code == 302
    cluster = ComputeCluster.objects.get(name="edge")
    assert cluster.mode == "kubernetes"
    assert response["Location"] == f"/compute/clusters/{cluster.pk}/"
    assert b"edge" in browser.get("/compute/").content


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "x", "mode": "swarm"}, b"Select a valid choice"),
        ({"name": "", "mode": "standalone"}, b"This field is required"),
        ({"name": "x" * 101, "mode": "standalone"}, b"at most 100 characters"),
        ({"name": "x", "mode": "argocd"}, b"Required in argocd mode"),
    ],
)
def test_cluster_create_bad_input_is_400(browser, workspace, data, message):
    response = browser.post("/compute/", {"workspace": str(workspace.pk), **data})
    assert response.status_code == 400
    assert message in response.content
    assert not ComputeCluster.objects.exists()


def test_cluster_create_form_hidden_and_refused_for_members(client, workspace, member_of):
    client.force_login(member_of(workspace, "member"))
    assert b"Create Cluster" not in client.get("/compute/").content
    assert (
        client.post("/compute/", {"workspace": str(workspace.pk), "name": "x", "mode": "standalone"}).status_code == 403
    )


def test_nodes_tab_columns_buttons_and_polling(browser, cluster, node):
    page = browser.get(f"/compute/clusters/{cluster.pk}/nodes/").content.decode()
    headers = re.findall(r"<th>(.*?)</th>", page)
    assert headers == ["Name", "Status", "CPU", "Memory", "GPU", "Containers", "Agent"]
    assert "gpu-box-1" in page
    assert "NVIDIA H100" in page
    assert "16 cores" in page
    assert 'hx-trigger="every 30s"' in page
    for label in ("Cordon", "Drain", "Delete"):
        assert f">{label}</button>" in page
    assert ">Uncordon</button>" not in page  # not applicable while online
    assert page.count("hx-confirm=") == 2  # drain and delete
    partial = browser.get(f"/compute/clusters/{cluster.pk}/nodes/", **HX).content.decode()
    assert partial.lstrip().startswith('<div id="nodes"')
    assert "<html" not in partial


def test_node_actions_through_htmx(browser, cluster, node):
    url = f"/compute/nodes/{node.pk}"
    response = browser.post(f"{url}/cordon/", **HX)
    assert response.status_code == 200
    assert Node.objects.get(pk=node.pk).status == NodeStatus.CORDONED
    assert b">Uncordon</button>" in response.content
    conflict = browser.post(f"{url}/cordon/", **HX)
    assert conflict.status_code == 409
    assert b"Cannot cordon a node that is cordoned." in conflict.content
    assert browser.post(f"{url}/uncordon/", **HX).status_code == 200
    assert browser.post(f"{url}/drain/", **HX).status_code == 200
    assert Node.objects.get(pk=node.pk).status == NodeStatus.CORDONED  # empty: drained at once
    serial = node.certificates.get().serial
    deleted = browser.post(f"{url}/delete/", **HX)
    assert deleted.status_code == 200
    assert b"certificate is revoked" in deleted.content
    assert not Node.objects.filter(pk=node.pk).exists()
    assert RevokedSerial.objects.filter(serial=serial).exists()


def test_node_actions_without_htmx_redirect_or_409(browser, cluster, node):
    assert browser.post(f"/compute/nodes/{node.pk}/drain/").status_code == 302
    conflict = browser.post(f"/compute/nodes/{node.pk}/cordon/")
    assert conflict.status_code == 409
    assert b"Cannot cordon a node that is cordoned." in conflict.content
    assert browser.post(f"/compute/nodes/{node.pk}/explode/").status_code == 404


def test_node_actions_forbidden_for_viewers_and_hidden(client, workspace, cluster, node, member_of):
    client.force_login(member_of(workspace, "viewer"))
    page = client.get(f"/compute/clusters/{cluster.pk}/nodes/").content
    assert b"gpu-box-1" in page
    assert b">Cordon</button>" not in page
    for action in ("cordon", "drain", "delete"):
        assert client.post(f"/compute/nodes/{node.pk}/{action}/", **HX).status_code == 403
    assert Node.objects.get(pk=node.pk).status == NodeStatus.ONLINE


def test_other_workspace_pages_are_404(client, other_workspace, cluster, node):
    client.force_login(other_workspace.memberships.get().user)
    assert client.get(f"/compute/clusters/{cluster.pk}/nodes/").status_code == 404
    assert client.get(f"/compute/clusters/{cluster.pk}/commands/").status_code == 404
    assert client.get(f"/compute/nodes/{node.pk}/").status_code == 404
    assert client.post(f"/compute/nodes/{node.pk}/delete/").status_code == 404
    assert client.post(f"/compute/clusters/{cluster.pk}/join-tokens/").status_code == 404
    assert b"prod" not in client.get("/compute/").content


def test_generate_join_token_dialog_shows_command_once(browser, cluster):
    page = browser.get(f"/compute/clusters/{cluster.pk}/commands/").content.decode()
    assert "Generate Join Token" in page
    response = browser.post(f"/compute/clusters/{cluster.pk}/join-tokens/", **HX)
    assert response.status_code == 200
    body = response.content.decode()
    (command,) = re.findall(
        r"curl -fsSL http://testserver/agent/install\.sh \| CLUSTER_TOKEN=(ct_node_[\w-]+) sh", body
    )
    token = JoinToken.objects.get()
    assert token.token_hash == services.hash_join_token(command)
    # The raw token is never shown again.
    assert command not in browser.get(f"/compute/clusters/{cluster.pk}/commands/").content.decode()


def test_join_token_forbidden_for_members(client, workspace, cluster, member_of):
    client.force_login(member_of(workspace, "member"))
    assert b"Generate Join Token" not in client.get(f"/compute/clusters/{cluster.pk}/commands/").content
    assert client.post(f"/compute/clusters/{cluster.pk}/join-tokens/", **HX).status_code == 403
    assert not JoinToken.objects.exists()


@pytest.mark.parametrize(
    "target",
    ["https://evil.example/", "//evil.example/x", "/\\evil.example", "javascript:alert(1)", "http://testserver.evil/"],
)
def test_node_action_next_redirects_only_to_this_host(browser, cluster, node, target):
    off_site = browser.post(f"/compute/nodes/{node.pk}/cordon/", {"next": target})
    assert off_site.status_code == 302
    assert off_site["Location"] == f"/compute/clusters/{cluster.pk}/nodes/"
    on_site = browser.post(f"/compute/nodes/{node.pk}/uncordon/", {"next": f"/compute/nodes/{node.pk}/"})
    assert on_site["Location"] == f"/compute/nodes/{node.pk}/"


def test_send_command_to_all_nodes_from_the_page(browser, cluster, register_node, django_capture_on_commit_callbacks):
    register_node(cluster, "a")
    register_node(cluster, "b")
    with django_capture_on_commit_callbacks() as callbacks:
        response = browser.post(
            f"/compute/clusters/{cluster.pk}/commands/",
            {
                "command_type": "container.create",
                "target": "all",
                "p-image": "nginx:1.27",
                "p-name": "web",
                "p-ports": "8080:80, 53/udp",
                "p-env": "A=1\nB=two",
                "p-command": "nginx -g 'daemon off;'",
            },
        )
    assert response.status_code == 302
    assert len(callbacks) == 1
    commands = list(Command.objects.all())
    assert len(commands) == 2
    assert commands[0].payload["ports"] == [
        {"container_port": 80, "host_port": 8080, "protocol": "tcp"},
        {"container_port": 53, "host_port": 0, "protocol": "udp"},
    ]
    assert commands[0].wire_payload()["env"] == {
        "A": "1",
        "B": "two",
    }  # env values are secret: only the agent sees them
    assert commands[0].payload["env"] == {"A": MASK, "B": MASK}
    assert commands[0].payload["command"] == ["nginx", "-g", "daemon off;"]
    page = browser.get(f"/compute/clusters/{cluster.pk}/commands/").content.decode()
    assert page.count("<code>container.create</code>") == 2
    assert "Queued" in page


def test_command_line_marked_secret_on_the_page_is_masked(browser, cluster, node):
    data = {
        "command_type": "container.create",
        "target": str(node.pk),
        "p-image": "nginx:1.27",
        "p-name": "web",
        "p-command": "serve --token tok-page",
        "p-command_secret": "on",
    }
    assert browser.post(f"/compute/clusters/{cluster.pk}/commands/", data).status_code == 302
    (command,) = Command.objects.all()
    assert command.payload["command"] == [MASK, MASK, MASK]
    assert command.wire_payload()["command"] == ["serve", "--token", "tok-page"]
    assert "secret_fields" not in command.wire_payload()


def test_send_command_to_one_node_and_see_it_in_the_event_log(browser, cluster, node):
    response = browser.post(
        f"/compute/clusters/{cluster.pk}/commands/",
        {"command_type": "model.download", "target": str(node.pk), "p-model_id": "Qwen/Qwen2.5-0.5B"},
    )
    assert response.status_code == 302
    (command,) = Command.objects.all()
    assert command.node == node
    assert command.payload["model_id"] == "Qwen/Qwen2.5-0.5B"
    log = browser.get(f"/compute/nodes/{node.pk}/").content.decode()
    assert "command.queued" in log
    assert "model.download queued by owner" in log
    partial = browser.get(f"/compute/nodes/{node.pk}/", **HX).content.decode()
    assert partial.lstrip().startswith('<div id="events"')


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"command_type": "container.create", "target": "all", "p-name": "web"}, "This field is required"),
        ({"command_type": "model.download", "target": "all", "p-model_id": "bad id!"}, "Not a valid model id"),
        (
            {"command_type": "container.create", "target": "all", "p-image": "i", "p-name": "w", "p-gpus": "x"},
            "Enter a whole number",
        ),
        (
            {"command_type": "container.create", "target": "all", "p-image": "i", "p-name": "w", "p-ports": "http"},
            "not a port mapping",
        ),
        ({"command_type": "endpoint.stop", "target": "nowhere", "p-endpoint_id": "e"}, "Select a valid choice"),
        ({"command_type": "container.reboot", "target": "all"}, "Select a valid choice"),
    ],
)
def test_send_command_bad_input_is_400(browser, cluster, node, data, message):
    response = browser.post(f"/compute/clusters/{cluster.pk}/commands/", data)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Command.objects.exists()


def test_send_command_conflict_is_409(browser, cluster, node, owner):
    services.node_cordon(node=node, actor=owner)
    response = browser.post(
        f"/compute/clusters/{cluster.pk}/commands/",
        {"command_type": "container.create", "target": "all", "p-image": "i", "p-name": "w"},
    )
    assert response.status_code == 409
    assert "No online nodes in this cluster." in response.content.decode()


def test_send_command_forbidden_for_members(client, workspace, cluster, node, member_of):
    client.force_login(member_of(workspace, "member"))
    page = client.get(f"/compute/clusters/{cluster.pk}/commands/").content
    assert b"Send a command" not in page
    response = client.post(
        f"/compute/clusters/{cluster.pk}/commands/",
        {"command_type": "container.stop", "target": "all", "p-container": "c"},
    )
    assert response.status_code == 403
    assert not Command.objects.exists()


def test_command_form_partial_per_type(browser, cluster):
    partial = browser.get(f"/compute/clusters/{cluster.pk}/commands/form/?command_type=endpoint.start", **HX)
    body = partial.content.decode()
    assert 'name="p-endpoint_id"' in body
    assert 'name="p-model_id"' in body
    assert 'name="p-image"' not in body
    page = browser.get(f"/compute/clusters/{cluster.pk}/commands/?send=container.stop").content.decode()
    assert 'name="p-container"' in page


def test_rename_from_the_node_page(browser, node):
    assert browser.post(f"/compute/nodes/{node.pk}/rename/", {"name": "trainer-1"}).status_code == 302
    assert Node.objects.get(pk=node.pk).name == "trainer-1"
    assert browser.post(f"/compute/nodes/{node.pk}/rename/", {"name": ""}).status_code == 400
    page = browser.get(f"/compute/clusters/{node.cluster_id}/nodes/").content.decode()
    assert "trainer-1" in page
    assert "gpu-box-1" in page


def test_bad_node_filter_is_400(browser, cluster, node):
    response = browser.get(f"/compute/clusters/{cluster.pk}/nodes/?status=asleep")
    assert response.status_code == 400
    assert b"status: Choose one of" in response.content


def test_settings_page_shows_mode_read_only_and_refuses_a_change(browser, cluster):
    page = browser.get(f"/compute/clusters/{cluster.pk}/settings/").content.decode()
    assert "Standalone (Docker)" in page
    assert 'name="mode"' not in page
    base = {"name": "prod", "description": "d", "git_branch": "main"}
    refused = browser.post(f"/compute/clusters/{cluster.pk}/settings/", {**base, "mode": "argocd"})
    assert refused.status_code == 400
    assert "cannot be changed after the cluster is created" in refused.content.decode()
    saved = browser.post(f"/compute/clusters/{cluster.pk}/settings/", {**base, "argocd_token": "t0k"})
    assert saved.status_code == 302
    cluster.refresh_from_db()
    assert (cluster.mode, cluster.description, cluster.argocd_token) == ("standalone", "d", "t0k")
    assert "t0k" not in browser.get(f"/compute/clusters/{cluster.pk}/settings/").content.decode()


def test_settings_page_forbidden_for_members(client, workspace, cluster, member_of):
    client.force_login(member_of(workspace, "member"))
    assert client.get(f"/compute/clusters/{cluster.pk}/settings/").status_code == 200
    assert client.post(f"/compute/clusters/{cluster.pk}/settings/", {"name": "x"}).status_code == 403


def test_duplicate_cluster_name_on_the_page_is_400(browser, workspace, cluster):
    response = browser.post("/compute/", {"workspace": str(workspace.pk), "name": "prod", "mode": "standalone"})
    assert response.status_code == 400
    assert b"already exists in the workspace" in response.content


def test_partition_pause_banner_and_resume_button(browser, client, owner, cluster, workspace, member_of):
    import datetime as dt

    from django.utils import timezone

    url = f"/compute/clusters/{cluster.pk}/nodes/"
    assert "are paused until" not in browser.get(url).content.decode()
    ComputeCluster.objects.filter(pk=cluster.pk).update(automation_paused_until=timezone.now() + dt.timedelta(hours=1))
    page = browser.get(url).content.decode()
    assert "Automatic drains and rescheduling are paused until" in page
    assert f"/compute/clusters/{cluster.pk}/resume-automation/" in page

    client.force_login(member_of(workspace, "member"))
    assert client.post(f"/compute/clusters/{cluster.pk}/resume-automation/").status_code == 403
    cluster.refresh_from_db()
    assert cluster.automation_paused()
    client.force_login(owner)
    response = client.post(f"/compute/clusters/{cluster.pk}/resume-automation/", follow=True)
    assert "Automation resumed" in response.content.decode()
    cluster.refresh_from_db()
    assert not cluster.automation_paused()
