"""Serializers of the fleet API: input shapes are validated here, rules live in the services."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet import agent_packages, agent_updates, payloads
from fleet.models import Command, ComputeCluster, Mode, Namespace, Node, NodeEvent


class ClusterSerializer(serializers.ModelSerializer):
    """A compute cluster; the ArgoCD token is write-only (`argocd_token_set` tells whether one is stored)."""

    node_count = serializers.IntegerField(read_only=True)
    argocd_token_set = serializers.SerializerMethodField()

    class Meta:
        model = ComputeCluster
        fields = [
            "id",
            "workspace",
            "name",
            "description",
            "mode",
            "argocd_server",
            "argocd_token_set",
            "git_repo_url",
            "git_branch",
            "node_count",
            "automation_paused_until",
            "auto_update_agents",
            "created_at",
        ]
        read_only_fields = fields

    def get_argocd_token_set(self, obj: ComputeCluster) -> bool:
        return bool(obj.argocd_token)


class _ClusterFields(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    argocd_server = serializers.CharField(max_length=500, required=False, allow_blank=True)
    argocd_token = serializers.CharField(max_length=4000, required=False, allow_blank=True, write_only=True)
    git_repo_url = serializers.CharField(max_length=500, required=False, allow_blank=True)
    git_branch = serializers.CharField(max_length=200, required=False, allow_blank=True)


class ClusterCreateSerializer(_ClusterFields):
    """Input of POST /clusters."""

    workspace = serializers.UUIDField()
    mode = serializers.ChoiceField(choices=Mode.choices, default=Mode.STANDALONE)


class ClusterUpdateSerializer(_ClusterFields):
    """Input of PATCH/PUT /clusters/{id}; `mode` is accepted only unchanged."""

    mode = serializers.CharField(max_length=32, required=False)
    auto_update_agents = serializers.BooleanField(required=False)


class JoinTokenSerializer(serializers.Serializer):
    """The one-time answer of POST /clusters/{id}/join-tokens."""

    id = serializers.UUIDField()
    token = serializers.CharField()
    join_command = serializers.CharField()
    expires_at = serializers.DateTimeField()


# Live figures of a heartbeat: null while the node does not report (offline, or its tunnel closed).
NODE_UTILIZATION_FIELDS = (
    "cpu_percent",
    "memory_used_mb",
    "memory_percent",
    "vram_used_mb",
    "gpu_utilization_percent",
)
GPU_UTILIZATION_KEYS = ("memory_used_mb", "utilization_percent")


class NodeSerializer(serializers.ModelSerializer):
    """A node with its facts and latest utilization; `agent_current`: its agent is the served version.

    `last_seen` is when the agent was last heard from (hello or heartbeat). While the node is not
    reporting (offline, or its tunnel closed) the utilization fields, and the used memory and
    utilization of each GPU, are null: the stored figures are stale and never shown as current.
    """

    last_seen = serializers.DateTimeField(source="last_seen_at", read_only=True, allow_null=True)
    cpu_percent = serializers.FloatField(read_only=True, allow_null=True)
    memory_used_mb = serializers.IntegerField(read_only=True, allow_null=True)
    memory_percent = serializers.FloatField(read_only=True, allow_null=True)
    vram_used_mb = serializers.IntegerField(read_only=True, allow_null=True)
    gpu_utilization_percent = serializers.FloatField(read_only=True, allow_null=True)
    agent_current = serializers.SerializerMethodField()
    agent_version_current = serializers.SerializerMethodField()

    def get_agent_current(self, obj: Node) -> bool:
        return agent_updates.is_current(obj)

    def get_agent_version_current(self, obj: Node) -> str:
        return agent_packages.served_version()

    class Meta:
        model = Node
        fields = [
            "id",
            "cluster",
            "name",
            "hostname",
            "status",
            "status_changed_at",
            "connected",
            "last_seen",
            "disconnected_at",
            "last_heartbeat_at",
            "cpu_count",
            "cpu_percent",
            "memory_total_mb",
            "memory_used_mb",
            "memory_percent",
            "gpu_model",
            "gpu_count",
            "gpus",
            "vram_total_mb",
            "vram_used_mb",
            "gpu_utilization_percent",
            "containers_count",
            "agent_version",
            "agent_current",
            "agent_version_current",
            "protocol_version",
            "os",
            "arch",
            "created_at",
        ]
        read_only_fields = fields

    def to_representation(self, instance: Node) -> dict[str, Any]:
        data = super().to_representation(instance)
        if not instance.reporting:
            data.update(dict.fromkeys(NODE_UTILIZATION_FIELDS))
            data["gpus"] = [
                {**gpu, **dict.fromkeys(GPU_UTILIZATION_KEYS)} if isinstance(gpu, dict) else gpu
                for gpu in data.get("gpus") or []
            ]
        return data


class NodeRenameSerializer(serializers.Serializer):
    """Input of PATCH /nodes/{id}: only the name can change."""

    name = serializers.CharField(max_length=100)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        extra = sorted(set(self.initial_data) - {"name"})
        if extra:
            raise serializers.ValidationError({k: ["This field cannot be changed."] for k in extra})
        return attrs


class CommandSerializer(serializers.ModelSerializer):
    """A command on one node (secret payload values are never returned: masked, or left out)."""

    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)
    node_name = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = Command
        fields = [
            "id",
            "cluster",
            "node",
            "node_name",
            "batch_id",
            "command_type",
            "payload",
            "idempotency_key",
            "status",
            "attempts",
            "created_by",
            "system",
            "created_at",
            "dispatched_at",
            "acked_at",
            "finished_at",
            "result",
            "error_code",
            "error_message",
        ]
        read_only_fields = fields


class CommandDispatchSerializer(serializers.Serializer):
    """Input of POST /clusters/{id}/commands; `node_id` null means every online node."""

    command_type = serializers.CharField(max_length=32)
    payload = serializers.DictField(
        required=False,
        default=dict,
        help_text=(
            "The command's fields. Secrets are stored encrypted and shown back masked (••••••): "
            "registry_password, every env value (container.create) and runtime_env.env_vars value "
            "(ray.job.submit), and the fields listed in payload.secret_fields, e.g. "
            '"secret_fields": ["command"]; markable: command, registry_username, extra_args, '
            "entrypoint, files, metadata, runtime_env."
        ),
    )
    node_id = serializers.UUIDField(required=False, allow_null=True, default=None)


class NodeEventSerializer(serializers.ModelSerializer):
    """One line of a node's event log."""

    class Meta:
        model = NodeEvent
        fields = ["id", "kind", "message", "data", "command", "created_at"]
        read_only_fields = fields


class NamespaceSerializer(serializers.ModelSerializer):
    """A namespace and the cluster it is bound to."""

    class Meta:
        model = Namespace
        fields = ["id", "workspace", "name", "cluster", "created_at"]
        read_only_fields = fields


class NamespaceCreateSerializer(serializers.Serializer):
    """Input of POST /namespaces."""

    workspace = serializers.UUIDField()
    name = serializers.CharField(max_length=63)
    cluster = serializers.UUIDField(required=False, allow_null=True, default=None)


class NamespaceBindSerializer(serializers.Serializer):
    """Input of PATCH /namespaces/{id}: (re)bind to a cluster, or null to unbind."""

    cluster = serializers.UUIDField(allow_null=True)


class AgentRegisterSerializer(serializers.Serializer):
    """Input of POST /agent/register (facts are checked against `agent.protocol.HostFacts`)."""

    token = serializers.CharField(max_length=200)
    csr_pem = serializers.CharField(max_length=16 * 1024, trim_whitespace=False)
    facts = serializers.DictField()
    cluster_id = serializers.UUIDField(required=False, allow_null=True, default=None)


# --------------------------------------------------------------------------------------------------
# Shapes for the API schema only (what POST /clusters/{id}/commands takes and answers, per command type)


class CommandBatchSerializer(serializers.Serializer):
    """The answer of POST /clusters/{id}/commands: one command per target node, sharing `batch_id`."""

    batch_id = serializers.UUIDField()
    commands = CommandSerializer(many=True)


class AgentRegisteredSerializer(serializers.Serializer):
    """The answer of POST /agent/register: the node's id, its certificate and the CA to pin."""

    node_id = serializers.UUIDField()
    certificate_pem = serializers.CharField()
    ca_certificate_pem = serializers.CharField()
    tunnel_path = serializers.CharField()
    heartbeat_interval_s = serializers.IntegerField()


def _payload_shape(base: type[serializers.Serializer]) -> type[serializers.Serializer]:
    """`base` plus the `secret_fields` it accepts (the markable fields it has), for the schema."""
    markable = sorted(set(base().fields) & payloads.MARKABLE_FIELDS)
    attrs: dict[str, Any] = {"__doc__": base.__doc__, "__module__": __name__}
    if markable:
        attrs[payloads.MARKS] = serializers.ListField(
            child=serializers.ChoiceField(choices=markable),
            required=False,
            help_text="Fields whose values are stored encrypted and shown back masked.",
        )
    return type(base.__name__.replace("Serializer", "Payload"), (base,), attrs)


_PAYLOAD_SHAPES: dict[type, type[serializers.Serializer]] = {}
_COMMAND_BODIES: dict[str, type[serializers.Serializer]] = {}


def command_bodies() -> dict[str, type[serializers.Serializer]]:
    """Command type → the request body that sends it (the schema's oneOf, discriminated by command_type).

    Read when the schema is built: every type `fleet.payloads` accepts by then (the Ray apps add theirs).
    """
    for command_type, base in payloads.PAYLOAD_SERIALIZERS.items():
        if command_type in _COMMAND_BODIES or command_type in payloads.OWNED_COMMANDS:
            continue  # an owned type is sent by its app's API only
        payload = _PAYLOAD_SHAPES.setdefault(base, _payload_shape(base))
        name = "".join(part.capitalize() for part in command_type.split(".")) + "Command"
        _COMMAND_BODIES[command_type] = type(
            name,
            (serializers.Serializer,),
            {
                "__doc__": f"A `{command_type}` command.",
                "__module__": __name__,
                "command_type": serializers.ChoiceField(choices=[command_type]),
                "node_id": serializers.UUIDField(
                    required=False, allow_null=True, help_text="The target node; null or absent: every online node."
                ),
                "payload": payload(),
            },
        )
    return dict(_COMMAND_BODIES)
