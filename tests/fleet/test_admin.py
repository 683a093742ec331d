"""Admin: every fleet model registered, mode read-only, commands and node actions respect roles."""

from __future__ import annotations

import json

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission

from fleet import models
from fleet.models import Command, ComputeCluster, NodeStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser(make_user, workspace):
    return make_user("root", is_staff=True, is_superuser=True)


def test_every_fleet_model_is_registered():
    for model in (
        models.ComputeCluster,
        models.JoinToken,
        models.Node,
        models.NodeCertificate,
        models.RevokedSerial,
        models.CertificateAuthority,
        models.Command,
        models.NodeEvent,
        models.Namespace,
    ):
        assert admin.site.is_registered(model), model


def test_cluster_mode_is_read_only_after_creation(client, superuser, cluster):
    client.force_login(superuser)
    page = client.get(f"/admin/fleet/computecluster/{cluster.pk}/change/").content.decode()
    assert 'name="mode"' not in page
    assert "Standalone (Docker)" in page
    add = client.get("/admin/fleet/computecluster/add/").content.decode()
    assert 'name="mode"' in add
    response = client.post(
        f"/admin/fleet/computecluster/{cluster.pk}/change/",
        {
            "name": "prod-renamed",
            "description": "",
            "mode": "kubernetes",
            "argocd_server": "",
            "argocd_token": "",
            "git_repo_url": "",
            "git_branch": "main",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    cluster.refresh_from_db()
    assert (cluster.name, cluster.mode) == ("prod-renamed", "standalone")


def _send(client, node, payload):
    return client.post(
        "/admin/fleet/node/",
        {
            "action": "send_command",
            "_selected_action": [str(node.pk)],
            "apply": "1",
            "command_type": "container.stop",
            "payload": json.dumps(payload),
        },
        follow=True,
    )


def test_superuser_sends_a_command_from_admin(client, superuser, node):
    client.force_login(superuser)
    form = client.post("/admin/fleet/node/", {"action": "send_command", "_selected_action": [str(node.pk)]})
    assert form.status_code == 200
    assert b"Send a command" in form.content
    response = _send(client, node, {"container": "web"})
    assert b"1 command(s) queued." in response.content
    assert Command.objects.get().node == node
    bad = _send(client, node, {"container": ""})
    assert b"payload.container" in bad.content
    assert Command.objects.count() == 1


def test_staff_member_without_operator_role_cannot_send_or_cordon(client, make_user, workspace, member_of, node):
    staff = member_of(workspace, "member")
    staff.is_staff = True
    staff.save()
    staff.user_permissions.add(*Permission.objects.filter(content_type__app_label="fleet"))
    client.force_login(staff)
    response = _send(client, node, {"container": "web"})
    assert b"Only workspace Owners and Admins" in response.content
    assert not Command.objects.exists()
    client.post("/admin/fleet/node/", {"action": "cordon", "_selected_action": [str(node.pk)]})
    node.refresh_from_db()
    assert node.status == NodeStatus.ONLINE


def test_admin_cordon_and_join_token(client, superuser, node, cluster):
    client.force_login(superuser)
    client.post("/admin/fleet/node/", {"action": "cordon", "_selected_action": [str(node.pk)]})
    node.refresh_from_db()
    assert node.status == NodeStatus.CORDONED
    response = client.post(
        "/admin/fleet/computecluster/",
        {"action": "generate_join_token", "_selected_action": [str(cluster.pk)]},
        follow=True,
    )
    assert b"CLUSTER_TOKEN=ct_node_" in response.content
    assert ComputeCluster.objects.get().join_tokens.filter(used_at__isnull=True).count() == 1


def test_admin_namespace_binding_refuses_a_cluster_of_another_workspace(
    client, superuser, workspace, cluster, other_cluster
):
    from fleet.models import Namespace

    client.force_login(superuser)
    bad = client.post(
        "/admin/fleet/namespace/add/",
        {"workspace": str(workspace.pk), "name": "team", "cluster": str(other_cluster.pk)},
    )
    assert bad.status_code == 200
    assert b"must belong to the namespace" in bad.content
    ok = client.post(
        "/admin/fleet/namespace/add/", {"workspace": str(workspace.pk), "name": "team", "cluster": str(cluster.pk)}
    )
    assert ok.status_code == 302
    assert Namespace.objects.get().cluster == cluster


@pytest.mark.django_db
def test_every_project_model_is_registered_in_admin():
    from django.apps import apps
    from django.contrib import admin as django_admin

    ours = [m for m in apps.get_models() if m._meta.app_label in ("tenancy", "fleet", "raymgr")]
    missing = [m.__name__ for m in ours if not django_admin.site.is_registered(m)]
    assert missing == []


def test_admin_shows_env_keys_never_values(client, superuser, cluster, owner, register_node):
    from fleet import services
    from fleet.workloads.models import Container
    from tests.fleet import agent_side

    node = register_node(cluster, "a")
    (command,) = services.command_dispatch(
        actor=owner,
        cluster=cluster,
        command_type="container.create",
        payload={"image": "nginx", "name": "web", "env": {"HF_TOKEN": "hf_admin_secret"}},
        node=node,
    )
    agent_side.result(command, container_id="c-web")
    container = Container.objects.get(created_by_command=command)
    client.force_login(superuser)
    for url in (
        f"/admin/fleet/command/{command.pk}/change/",
        "/admin/fleet/command/",
        f"/admin/fleet/container/{container.pk}/change/",
    ):
        page = client.get(url)
        assert page.status_code == 200, url
        assert b"hf_admin_secret" not in page.content, url
    assert b"HF_TOKEN" in client.get(f"/admin/fleet/command/{command.pk}/change/").content
