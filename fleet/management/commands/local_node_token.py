"""Prepare the local demo node of `.ci/up`: the "local" standalone cluster and, when needed, a join token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet import services
from fleet.models import ComputeCluster, Mode, Node, NodeCertificate
from tenancy.models import Membership, Role, Workspace

CLUSTER_NAME = "local"


def local_cluster(workspace: Workspace, actor: Any) -> ComputeCluster:
    """The workspace's "local" standalone cluster, created on first use."""
    cluster = ComputeCluster.objects.filter(workspace=workspace, name=CLUSTER_NAME).first()
    if cluster is None:
        cluster = services.cluster_create(
            actor=actor,
            workspace=workspace,
            name=CLUSTER_NAME,
            mode=Mode.STANDALONE,
            description="This machine, joined by .ci/up (containers run on its Podman engine).",
        )
    return cluster


def joined_node(state_dir: Path, cluster: ComputeCluster, url: str) -> Node | None:
    """The node the agent state in `state_dir` is, if it still belongs to `cluster` with a valid
    certificate and dials `url`; None when the agent must join (again)."""
    try:
        config = json.loads((state_dir / "node.json").read_text())
        certificate_pem = (state_dir / "node.crt").read_text()
    except (OSError, ValueError):
        return None
    if config.get("control_plane_url", "").rstrip("/") != url.rstrip("/"):
        return None
    node = Node.objects.filter(pk=config.get("node_id"), cluster=cluster).first()
    if node is None:
        return None
    valid = NodeCertificate.objects.filter(node=node, certificate_pem=certificate_pem, revoked_at__isnull=True)
    return node if valid.exists() else None


class Command(BaseCommand):
    """Print a join token for the local node, or nothing when its agent state is still a live node."""

    help = (
        'Make sure the Demo workspace has a standalone cluster named "local"; print a join token for it '
        "unless the agent state in --state-dir is already a node of it that dials --url."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--state-dir", required=True, help="the local agent's state directory")
        parser.add_argument("--url", required=True, help="the control plane URL the agent dials")
        parser.add_argument("--workspace", default="demo", help="workspace slug (bootstrap_demo makes 'demo')")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = Workspace.objects.filter(slug=options["workspace"]).first()
        if workspace is None:
            raise CommandError(f"no workspace {options['workspace']!r}: run `python manage.py bootstrap_demo` first")
        owner = (
            Membership.objects.filter(workspace=workspace, role=Role.OWNER)
            .select_related("user")
            .order_by("pk")
            .first()
        )
        if owner is None:
            raise CommandError(f"workspace {workspace.slug!r} has no owner to act for")
        cluster = local_cluster(workspace, owner.user)
        if joined_node(Path(options["state_dir"]), cluster, options["url"]) is not None:
            return
        _, raw = services.join_token_create(cluster=cluster, actor=owner.user)
        self.stdout.write(raw)
