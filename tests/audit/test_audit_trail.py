"""The audit trail as the services write it: one entry per operator action, in the action's own
transaction; refusals recorded after their rollback; command outcomes and argocd commits followed."""

from __future__ import annotations

import subprocess

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from agent import protocol
from agent.executors.argocd import ArgoCDExecutor
from audit.models import AuditEntry, Outcome
from fleet import services
from fleet.models import Command, NodeStatus
from fleet.workloads import services as workload_services
from fleet.workloads.models import NodeModel
from kernel.exceptions import IllegalTransition
from raymgr import services as ray_services
from tests.agent.executors.test_argocd import BRANCH, git, quiet
from tests.support.argocd_standin import ArgoCDStandin

pytestmark = pytest.mark.django_db


def _entries() -> list[tuple[str, str, str, str, str]]:
    rows = AuditEntry.objects.order_by("created_at", "id")
    return [(e.actor_name, e.action, e.target_type, e.target_name, e.outcome) for e in rows]


def test_every_fleet_operator_action_writes_one_entry(owner, workspace, cluster, register_node):
    AuditEntry.objects.all().delete()  # the fixtures' own actions
    node = register_node(cluster, "box-1")
    AuditEntry.objects.all().delete()
    services.cluster_update(actor=owner, cluster=cluster, description="GPUs", argocd_token="")
    services.node_rename(node=node, actor=owner, name="gpu-1")
    services.node_cordon(node=node, actor=owner)
    services.node_uncordon(node=node, actor=owner)
    services.node_drain(node=node, actor=owner)
    services.cluster_resume_automation(actor=owner, cluster=cluster)
    namespace = services.namespace_create(actor=owner, workspace=workspace, name="team-a")
    services.namespace_bind(actor=owner, namespace=namespace, cluster_id=cluster.pk)
    services.namespace_delete(actor=owner, namespace=namespace)
    services.node_delete(node=node, actor=owner)
    created = services.cluster_create(actor=owner, workspace=workspace, name="edge")
    created_id = str(created.pk)
    services.join_token_create(cluster=created, actor=owner)
    services.cluster_delete(actor=owner, cluster=created)

    assert _entries() == [
        ("owner", "cluster.update", "cluster", "prod", "ok"),
        ("owner", "node.rename", "node", "box-1", "ok"),
        ("owner", "node.cordon", "node", "gpu-1", "ok"),
        ("owner", "node.uncordon", "node", "gpu-1", "ok"),
        ("owner", "node.drain", "node", "gpu-1", "ok"),
        ("owner", "cluster.resume_automation", "cluster", "prod", "ok"),
        ("owner", "namespace.create", "namespace", "team-a", "ok"),
        ("owner", "namespace.bind", "namespace", "team-a", "ok"),
        ("owner", "namespace.delete", "namespace", "team-a", "ok"),
        ("owner", "node.delete", "node", "gpu-1", "ok"),
        ("owner", "cluster.create", "cluster", "edge", "ok"),
        ("owner", "join_token.create", "cluster", "edge", "ok"),
        ("owner", "cluster.delete", "cluster", "edge", "ok"),
    ]
    entries = {e.action: e for e in AuditEntry.objects.all()}
    assert {e.workspace_id for e in entries.values()} == {workspace.pk}
    assert all(e.actor_id == owner.pk and e.finished_at == e.created_at for e in entries.values())
    assert entries["cluster.update"].detail == {"fields": ["argocd_token", "description"]}  # names, never values
    assert entries["node.rename"].detail == {"name": "gpu-1"}
    assert entries["node.delete"].target_id == str(node.pk)  # kept after the row is gone
    assert entries["cluster.create"].target_id == entries["cluster.delete"].target_id == created_id
    assert entries["join_token.create"].detail["join_token"]


def test_refusals_are_recorded_after_the_rollback(owner, viewer, workspace, cluster, register_node):
    node = register_node(cluster, "box-1")
    AuditEntry.objects.all().delete()

    with pytest.raises(PermissionDenied):
        services.node_cordon(node=node, actor=viewer)
    with pytest.raises(IllegalTransition):
        services.node_uncordon(node=node, actor=owner)
    with pytest.raises(ValidationError):
        services.cluster_create(actor=owner, workspace=workspace, name="prod")
    services.node_cordon(node=node, actor=owner)
    with pytest.raises(IllegalTransition):
        services.command_dispatch(
            actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "a/b"}, node=None
        )

    node.refresh_from_db()
    assert node.status == NodeStatus.CORDONED
    assert not Command.objects.exists()
    refused = AuditEntry.objects.filter(outcome=Outcome.REFUSED).order_by("created_at")
    assert [(e.actor_name, e.action, e.target_name, e.reason) for e in refused] == [
        ("viewer-acme", "node.cordon", "box-1", "Only workspace Owners and Admins can do this."),
        ("owner", "node.uncordon", "box-1", "Only cordoned or draining nodes can be uncordoned; this node is online."),
        ("owner", "cluster.create", "prod", "name: A cluster with this name already exists in the workspace."),
        ("owner", "command.dispatch", "prod", "No online nodes in this cluster."),
    ]
    assert refused.last().detail == {"command_type": "model.download", "node": None}
    assert all(e.workspace_id == workspace.pk and e.finished_at for e in refused)


def test_an_entry_commits_or_rolls_back_with_its_action(owner, cluster, register_node):
    node = register_node(cluster, "box-1")
    AuditEntry.objects.all().delete()
    inside: list[int] = []

    def cordon_then_fail() -> None:
        with transaction.atomic():
            services.node_cordon(node=node, actor=owner)
            inside.append(AuditEntry.objects.filter(action="node.cordon").count())
            raise RuntimeError("the caller's transaction fails after the action")

    with pytest.raises(RuntimeError):
        cordon_then_fail()
    assert inside == [1]
    assert not AuditEntry.objects.exists()
    node.refresh_from_db()
    assert node.status == NodeStatus.ONLINE


def test_a_dispatch_stays_pending_until_its_commands_finish(owner, cluster, register_node):
    a, b = register_node(cluster, "a"), register_node(cluster, "b")
    (one,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=a
    )
    entry = AuditEntry.objects.get(action="command.dispatch")
    assert (entry.outcome, entry.target_type, entry.target_name, entry.finished_at) == ("pending", "node", "a", None)
    assert entry.detail == {"command_type": "model.download", "node": "a", "batch_id": str(one.batch_id), "commands": 1}
    assert one.audit_entry_id == entry.pk
    services.command_record_ack(node=a, command_id=one.pk)
    entry.refresh_from_db()
    assert entry.outcome == "pending"
    services.command_record_result(node=a, command_id=one.pk, data={"path": "/cache/acme/tiny"})
    entry.refresh_from_db()
    assert (entry.outcome, entry.git_commit) == ("ok", "")
    assert entry.finished_at is not None

    fan_out = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "web"}
    )
    entry = AuditEntry.objects.get(action="command.dispatch", target_type="cluster")
    assert (entry.outcome, entry.detail["commands"]) == ("pending", 2)
    first, second = sorted(fan_out, key=lambda c: c.node.name)
    services.command_record_result(node=a, command_id=first.pk, data={})
    entry.refresh_from_db()
    assert entry.outcome == "pending"  # one of two finished
    services.command_record_error(node=b, command_id=second.pk, code="not_found", message="no container web")
    entry.refresh_from_db()
    assert (entry.outcome, entry.reason) == ("failed", "container.stop failed: not_found: no container web")


def test_commands_of_a_larger_action_follow_its_entry_and_automatic_ones_have_none(
    owner, workspace, cluster, register_node
):
    node = register_node(cluster, "gpu")
    NodeModel.objects.create(node=node, model_id="acme/tiny", revision="main", path="/cache/acme/tiny")
    AuditEntry.objects.all().delete()
    endpoint = workload_services.endpoint_create(actor=owner, cluster=cluster, model_id="acme/tiny")
    ray = ray_services.ray_cluster_create(actor=owner, workspace=workspace, compute_cluster=cluster, name="ray")
    automatic = services.command_queue(
        actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "x"}, node=node
    )

    assert [(a, t, o) for _, a, t, _, o in _entries()] == [
        ("endpoint.create", "endpoint", "pending"),
        ("ray_cluster.create", "ray_cluster", "pending"),
    ]
    by_action = {e.action: e for e in AuditEntry.objects.all()}
    assert by_action["endpoint.create"].target_id == str(endpoint.pk)
    assert by_action["endpoint.create"].detail == {"model_id": "acme/tiny", "revision": "main"}
    start = Command.objects.get(command_type="endpoint.start")
    head = Command.objects.get(command_type="ray.head.start")
    assert (start.audit_entry, head.audit_entry) == (by_action["endpoint.create"], by_action["ray_cluster.create"])
    assert by_action["ray_cluster.create"].target_id == str(ray.pk)
    assert automatic[0].audit_entry_id is None
    services.command_record_error(node=node, command_id=head.pk, code="internal", message="ray did not start")
    by_action["ray_cluster.create"].refresh_from_db()
    assert by_action["ray_cluster.create"].outcome == "failed"


def test_an_argocd_deploy_records_the_commit_its_agent_pushed(owner, workspace, register_node, tmp_path):
    bare = tmp_path / "gitops.git"
    subprocess.run(["git", "init", "--bare", "-q", str(bare)], check=True)
    standin = ArgoCDStandin().start()
    try:
        cluster = services.cluster_create(
            actor=owner,
            workspace=workspace,
            name="gitops",
            mode="argocd",
            argocd_server=standin.url,
            argocd_token=standin.token,
            git_repo_url=str(bare),
            git_branch=BRANCH,
        )
        node = register_node(cluster, "argo-agent")
        (command,) = services.command_dispatch(
            actor=owner,
            cluster=cluster,
            command_type="container.create",
            payload={"image": "nginx:1.27", "name": "web"},
            node=node,
        )
        # The node's agent runs it with the executor its cluster's mode settings make (as `agent.runner`).
        mode = cluster.mode_settings()
        standin.apps.add(mode["app_name"])
        executor = ArgoCDExecutor(
            repo_url=mode["repo_url"],
            branch=mode["branch"],
            server=mode["server"],
            token=mode["token"],
            app_name=mode["app_name"],
            workdir=tmp_path / "agent",
        )
        payload = protocol.parse_payload("container.create", command.wire_payload())
        result = executor.execute("container.create", payload, command_key=command.idempotency_key, progress=quiet)
    finally:
        standin.stop()
    services.command_record_result(node=node, command_id=command.pk, data=protocol.to_dict(result))

    entry = AuditEntry.objects.get(action="command.dispatch")
    head = git(bare, "rev-parse", BRANCH).strip()
    assert len(head) == 40
    assert (entry.outcome, entry.git_commit, entry.target_name) == ("ok", head, "argo-agent")
