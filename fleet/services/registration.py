"""Join tokens and node registration: mint a token, register a node with it (single use), expire old ones."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import secrets
import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from agent import protocol
from audit.services import on, operator_action
from fleet import ca
from fleet.exceptions import JoinTokenRejected
from fleet.models import ComputeCluster, JoinToken, Node, NodeCertificate
from fleet.services.common import host_fact_fields, host_facts_parse
from fleet.services.events import node_event_record
from tenancy.mixins import require_operator

JOIN_TOKEN_PREFIX = "ct_node_"
JOIN_TOKEN_TTL = dt.timedelta(hours=24)


def hash_join_token(raw: str) -> str:
    """SHA-256 hex of a raw join token, as stored."""
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def join_command(raw_token: str, base_url: str | None = None) -> str:
    """The one-line install command an operator pastes on the new node (at `base_url` if given)."""
    base = (base_url or settings.CONTROL_PLANE_URL).rstrip("/")
    return f"curl -fsSL {base}/agent/install.sh | CLUSTER_TOKEN={raw_token} sh"


@operator_action(
    "join_token.create",
    target=on("cluster", "cluster"),
    detail=lambda _, value: (
        {"join_token": str(value[0].pk), "expires_at": value[0].expires_at.isoformat()} if value else {}
    ),
)
def join_token_create(*, cluster: ComputeCluster, actor: AbstractBaseUser) -> tuple[JoinToken, str]:
    """Mint a join token for `cluster`; returns the row and the raw token (shown once, never stored)."""
    require_operator(actor, cluster.workspace)
    raw = JOIN_TOKEN_PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii").rstrip("=")
    token = JoinToken.objects.create(
        cluster=cluster,
        token_hash=hash_join_token(raw),
        created_by=actor,
        expires_at=timezone.now() + JOIN_TOKEN_TTL,
    )
    return token, raw


def node_register(
    *,
    token: str,
    csr_pem: str,
    facts: protocol.HostFacts | dict[str, Any],
    cluster_id: uuid.UUID | str | None = None,
) -> tuple[Node, str]:
    """Register a node with a join token and CSR; return the node and its signed certificate PEM.

    The token is consumed by a conditional UPDATE in the same transaction that creates the node, so it
    is single-use even under concurrent requests; any failure leaves neither a node nor a used token.
    `cluster_id`, when the agent names the cluster it expects, must match the token's cluster.
    """
    parsed = host_facts_parse(facts)
    if not isinstance(token, str) or not token.startswith(JOIN_TOKEN_PREFIX) or len(token) > 200:
        raise JoinTokenRejected("This is not a CleverThis join token.", "token_invalid")
    token_hash = hash_join_token(token)
    with transaction.atomic():
        now = timezone.now()
        row = JoinToken.objects.select_related("cluster").filter(token_hash=token_hash).first()
        if row is None:
            raise JoinTokenRejected("Unknown join token.", "token_invalid")
        if cluster_id is not None and str(row.cluster_id) != str(cluster_id):
            raise JoinTokenRejected("This join token belongs to another cluster.", "token_wrong_cluster")
        if row.used_at is not None:
            raise JoinTokenRejected("This join token has already been used.", "token_used")
        if row.expires_at <= now:
            raise JoinTokenRejected("This join token has expired; generate a new one.", "token_expired")
        claimed = JoinToken.objects.filter(pk=row.pk, used_at__isnull=True, expires_at__gt=now).update(used_at=now)
        if claimed != 1:
            raise JoinTokenRejected("This join token has already been used.", "token_used")
        node = Node(id=uuid.uuid4(), cluster=row.cluster, name=parsed.hostname[:100], **host_fact_fields(parsed))
        cert_pem, serial, fingerprint = ca.sign_node_csr(csr_pem=csr_pem, node_id=node.id)
        node.save(force_insert=True)
        NodeCertificate.objects.create(
            node=node, serial=serial, fingerprint_sha256=fingerprint, certificate_pem=cert_pem
        )
        JoinToken.objects.filter(pk=row.pk).update(node=node)
        node_event_record(
            node_id=node.id,
            kind="registered",
            message=f"Registered from host {parsed.hostname}",
            data={"serial": serial},
        )
    return node, cert_pem


@transaction.atomic
def join_tokens_expire() -> int:
    """Delete expired, unused join tokens; returns how many."""
    deleted, _ = JoinToken.objects.filter(used_at__isnull=True, expires_at__lte=timezone.now()).delete()
    return deleted
