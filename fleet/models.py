"""Fleet models: compute clusters, nodes, join tokens, node certificates, commands and node events."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from agent import protocol
from fleet import payloads
from fleet.crypto import EncryptedTextField
from kernel.eventlog import EventLogEntry
from tenancy.models import Workspace


class Mode(models.TextChoices):
    """How a cluster's nodes run workloads; fixed when the cluster is created."""

    STANDALONE = "standalone", "Standalone (Docker)"
    KUBERNETES = "kubernetes", "Kubernetes"
    ARGOCD = "argocd", "ArgoCD (GitOps)"


class ComputeCluster(models.Model):
    """A group of nodes in one workspace sharing one orchestration mode."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="compute_clusters")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True, default="", max_length=2000)
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.STANDALONE)
    argocd_server = models.CharField(max_length=500, blank=True, default="")
    argocd_token = EncryptedTextField(blank=True, default="")
    git_repo_url = models.CharField(max_length=500, blank=True, default="")
    git_branch = models.CharField(max_length=200, blank=True, default="main")
    # Set when a suspected network partition took many nodes offline at once: automatic drains and
    # rescheduling (drain passes, the Ray autoscaler) leave this cluster alone until then.
    automation_paused_until = models.DateTimeField(null=True, blank=True)
    # When set (the default), nodes whose agent is not the version the control plane serves are updated
    # when they connect.
    auto_update_agents = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="computecluster_unique_workspace_name")
        ]

    def __str__(self) -> str:
        return self.name

    def automation_paused(self, now: Any = None) -> bool:
        """True while automatic drain/rescheduling is paused after a suspected partition."""
        from django.utils import timezone

        return self.automation_paused_until is not None and self.automation_paused_until > (now or timezone.now())

    def mode_settings(self) -> dict[str, Any]:
        """Settings the agent needs for this cluster's mode (sent in `Welcome`; the token is decrypted)."""
        if self.mode != Mode.ARGOCD:
            return {}
        return {
            "server": self.argocd_server,
            "token": self.argocd_token,
            "repo_url": self.git_repo_url,
            "branch": self.git_branch,
            "app_name": f"cleverthis-{self.pk}",
        }


class JoinToken(models.Model):
    """A single-use, 24-hour secret that lets one agent register a node into a cluster; stored hashed."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    cluster = models.ForeignKey(ComputeCluster, on_delete=models.CASCADE, related_name="join_tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    node = models.ForeignKey("Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"join token {self.token_hash[:8]}… for {self.cluster_id}"


class NodeStatus(models.TextChoices):
    """Scheduling state of a node."""

    ONLINE = "online", "Online"
    OFFLINE = "offline", "Offline"
    CORDONED = "cordoned", "Cordoned"
    DRAINING = "draining", "Draining"


class Node(models.Model):
    """A machine running the agent, registered into one cluster; its facts and latest utilization."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    cluster = models.ForeignKey(ComputeCluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=100)
    hostname = models.CharField(max_length=253)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.OFFLINE)
    status_changed_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    connected = models.BooleanField(default=False)
    # The tunnel recorded as connected (a fresh id per authenticated socket): the close of an older
    # socket, noticed late, never marks a newer tunnel of the same node disconnected.
    tunnel_session = models.UUIDField(null=True, blank=True)
    # When the node's tunnel last closed; it goes offline NODE_OFFLINE_GRACE_S later unless it reconnected.
    disconnected_at = models.DateTimeField(null=True, blank=True)
    # The channel-layer inbox of the control-plane process holding the tunnel (fleet.tunnel.local_tunnels).
    tunnel_inbox = models.CharField(max_length=200, blank=True, default="")
    # The peer address (`host:port`) of that process, where other processes open streams to the tunnel
    # (fleet.tunnel.peer_listener); "" while disconnected.
    tunnel_peer = models.CharField(max_length=300, blank=True, default="")
    cpu_count = models.PositiveIntegerField(default=0)
    memory_total_mb = models.PositiveBigIntegerField(default=0)
    cpu_percent = models.FloatField(default=0.0)
    memory_percent = models.FloatField(default=0.0)
    memory_used_mb = models.PositiveBigIntegerField(default=0)
    gpu_model = models.CharField(max_length=200, blank=True, default="")
    gpu_count = models.PositiveIntegerField(default=0)
    gpus = models.JSONField(default=list, blank=True)
    vram_total_mb = models.PositiveBigIntegerField(default=0)
    vram_used_mb = models.PositiveBigIntegerField(default=0)
    gpu_utilization_percent = models.FloatField(default=0.0)
    containers_count = models.PositiveIntegerField(default=0)
    agent_version = models.CharField(max_length=100, blank=True, default="")
    # The wire protocol version of the agent's last tunnel (0: never connected).
    protocol_version = models.PositiveSmallIntegerField(default=0)
    os = models.CharField(max_length=200, blank=True, default="")
    arch = models.CharField(max_length=50, blank=True, default="")
    inventory = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "created_at"]
        indexes = [models.Index(fields=["status", "last_heartbeat_at"], name="node_status_heartbeat")]

    def __str__(self) -> str:
        return self.name

    @property
    def short_id(self) -> str:
        """The first 8 hex digits of the node's id: what tells apart nodes of one host (both are named after
        the hostname until renamed), shown beside the name."""
        return self.pk.hex[:8] if self.pk else ""

    @property
    def last_seen_at(self) -> Any:
        """When the agent was last heard from: its last hello or heartbeat (None: never)."""
        return self.last_heartbeat_at

    @property
    def reporting(self) -> bool:
        """True while utilization figures are live: the tunnel is up and the node is not offline.

        Otherwise the stored CPU/RAM/GPU figures are the last ones heard and must not be shown as current.
        """
        return self.connected and self.status != NodeStatus.OFFLINE


class NodeCertificate(models.Model):
    """A client certificate our CA issued to a node."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="certificates")
    serial = models.CharField(max_length=64, unique=True)
    fingerprint_sha256 = models.CharField(max_length=64)
    certificate_pem = models.TextField()
    issued_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-issued_at"]

    def __str__(self) -> str:
        return f"certificate {self.serial} of {self.node_id}"


class RevokedSerial(models.Model):
    """The revocation list: serials of node certificates that must never be accepted again."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    serial = models.CharField(max_length=64, unique=True)
    revoked_at = models.DateTimeField(auto_now_add=True)
    reason = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-revoked_at"]

    def __str__(self) -> str:
        return f"revoked {self.serial}"


class CertificateAuthority(models.Model):
    """The control plane's own CA (one row); its private key is encrypted at rest."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=50, unique=True, default="default")
    certificate_pem = models.TextField()
    private_key = EncryptedTextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "certificate authority"
        verbose_name_plural = "certificate authority"

    def __str__(self) -> str:
        return f"CA {self.name}"


class CommandStatus(models.TextChoices):
    """Lifecycle of one command on one node."""

    QUEUED = "queued", "Queued"
    DISPATCHED = "dispatched", "Dispatched"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"

    @classmethod
    def terminal(cls) -> frozenset[str]:
        return frozenset({cls.SUCCEEDED, cls.FAILED})


# Statuses of a command still under way (in this order in the partial index below and its queries).
COMMAND_OPEN_STATUSES = (CommandStatus.QUEUED.value, CommandStatus.DISPATCHED.value, CommandStatus.RUNNING.value)


# Commands a node can run: one member per command type of the protocol (`agent.protocol.COMMAND_TYPES`, the one
# list), named after it: `CommandType.ENDPOINT_START` is "endpoint.start", and so is its label.
CommandType = models.TextChoices(
    "CommandType",
    [(command_type.replace(".", "_").upper(), (command_type, command_type)) for command_type in protocol.COMMAND_TYPES],
)
CommandType.__doc__ = "Commands a node can run: `agent.protocol.COMMAND_TYPES`, one member each."


class Command(models.Model):
    """One command for one node; `idempotency_key` makes re-delivery safe."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="commands")
    cluster = models.ForeignKey(ComputeCluster, on_delete=models.CASCADE, related_name="commands")
    batch_id = models.UUIDField(default=uuid.uuid4, db_index=True)
    command_type = models.CharField(max_length=32, choices=CommandType.choices)
    payload = models.JSONField(default=dict, blank=True)
    # Secret payload values (registry password, env values, fields marked secret) kept out of
    # `payload` (which shows them masked), as encrypted JSON; see `fleet.payloads.split_secrets`.
    secrets = EncryptedTextField(blank=True, default="")
    idempotency_key = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=16, choices=CommandStatus.choices, default=CommandStatus.QUEUED)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    # Sent by the control plane itself (status polls, the Ray autoscaler, drains, follow-ups), not as
    # part of an operator action: shown as "system" and hidden from the Commands page by default.
    system = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    acked_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    result = models.JSONField(default=dict, blank=True)
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    # The operator action that sent it (its audit entry follows the command to its outcome); null for
    # automatic commands (drains, the Ray autoscaler).
    audit_entry = models.ForeignKey(
        "audit.AuditEntry", null=True, blank=True, on_delete=models.SET_NULL, related_name="commands"
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["node", "status", "created_at"], name="command_node_status_created"),
            models.Index(fields=["cluster", "system", "-created_at"], name="command_cluster_system_created"),
            # An operator action's commands still under way: settling its audit entry asks whether any is
            # left without reading the finished ones (a fan-out to 10,000 nodes has 10,000 commands).
            models.Index(
                fields=["audit_entry"],
                condition=models.Q(status__in=COMMAND_OPEN_STATUSES),
                name="command_open_by_audit_entry",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.command_type} on {self.node_id} ({self.status})"

    @property
    def by(self) -> str:
        """Who sent it, as pages show it: "system" for the control plane's own commands."""
        if self.system:
            return "system"
        return self.created_by.get_username() if self.created_by else "—"

    @property
    def finished(self) -> bool:
        """Succeeded or failed: nothing about it changes any more."""
        return self.status in CommandStatus.terminal()

    def parse_result(self) -> Any:
        """Read `result` into its typed form (`agent.protocol.parse_result`, lenient with an older or newer
        agent's fields) and keep it as `parsed_result`; None unless the command succeeded."""
        if self.status != CommandStatus.SUCCEEDED:
            return None
        parsed = protocol.parse_result(self.command_type, self.result)
        self.__dict__["_parsed_result"] = (self.result, parsed)
        return parsed

    @property
    def parsed_result(self) -> Any:
        """The typed result of a succeeded command (e.g. `protocol.ContainerResult`), parsed once when it was
        recorded (`fleet.services.command_records`) or on first use; None unless it succeeded. The raw dict
        stays in `result`."""
        kept = self.__dict__.get("_parsed_result")
        if kept is not None and kept[0] is self.result and self.status == CommandStatus.SUCCEEDED:
            return kept[1]
        return self.parse_result()

    @property
    def parsed_payload(self) -> Any:
        """The payload as its protocol dataclass (e.g. `protocol.EndpointStartPayload`), secrets masked as
        stored (`agent.protocol.read_payload`); None when it does not read as one."""
        return protocol.read_payload(self.command_type, self.payload)

    def submitted_payload(self) -> dict[str, Any]:
        """The payload as it was submitted: secrets merged back in, `secret_fields` marks kept."""
        return payloads.join_secrets(dict(self.payload), json.loads(self.secrets) if self.secrets else {})

    def wire_payload(self) -> dict[str, Any]:
        """The payload as the agent must receive it (secrets merged back in)."""
        return payloads.wire(self.submitted_payload())


class NodeEvent(EventLogEntry):
    """One line of a node's event log (status changes, command steps, connections)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    command = models.ForeignKey(Command, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")

    class Meta(EventLogEntry.Meta):
        indexes = [models.Index(fields=["node", "-created_at"], name="nodeevent_node_created")]


class ClusterEvent(EventLogEntry):
    """One line of a cluster's own event log (e.g. a suspected network partition)."""

    cluster = models.ForeignKey(ComputeCluster, on_delete=models.CASCADE, related_name="events")

    class Meta(EventLogEntry.Meta):
        indexes = [models.Index(fields=["cluster", "-created_at"], name="clusterevent_cluster_created")]


class Namespace(models.Model):
    """A workspace namespace, optionally bound to the compute cluster its workloads run on."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="namespaces")
    name = models.CharField(
        max_length=63,
        validators=[
            RegexValidator(
                r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                "Use lower-case letters, digits and hyphens (a DNS label).",
            )
        ],
    )
    cluster = models.ForeignKey(
        ComputeCluster, null=True, blank=True, on_delete=models.SET_NULL, related_name="namespaces"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="namespace_unique_workspace_name")]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.cluster_id and self.workspace_id and self.cluster.workspace_id != self.workspace_id:
            raise ValidationError({"cluster": "The cluster must belong to the namespace's workspace."})


# Django must see every model of the app while it loads `fleet.models`: the workload models (containers,
# cached models, endpoints) live in `fleet.workloads.models` under the same `fleet` app label. Import
# them from there; nothing is re-exported here.
from fleet.usage import models as usage_models  # noqa: E402,F401  (the usage rollups, same way)
from fleet.workloads import models as workload_models  # noqa: E402,F401
