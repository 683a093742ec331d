"""Serializers of the workloads API: containers, model locations, endpoints (their replicas, events, create,
limits, revision and update bodies). The endpoint fields take their bounds from `endpoint.start`'s payload
rules (`fleet.payload_schema`), so the API and the wire protocol cannot disagree."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agent import protocol
from fleet.payload_schema import payload_field
from fleet.replica_load import QueueLoad, ReplicaLoad
from fleet.workloads import selectors
from fleet.workloads import services as workload_services
from fleet.workloads.errors import error_help
from fleet.workloads.groups import MemberState, group_source
from fleet.workloads.models import Container, Endpoint, EndpointEvent, EndpointReplica, NodeModel, RoutingPolicy


class ContainerSerializer(serializers.ModelSerializer):
    """A workload container on a node; `error_help` explains `error_code`."""

    node_name = serializers.CharField(source="node.name", read_only=True)
    error_help = serializers.SerializerMethodField()

    class Meta:
        model = Container
        fields = [
            "id",
            "node",
            "node_name",
            "cluster",
            "container_id",
            "name",
            "image",
            "status",
            "spec",
            "replacement_of",
            "created_by_command",
            "error_code",
            "error_message",
            "error_help",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_error_help(self, obj: Container) -> dict[str, str] | None:
        return error_help(obj.error_code)


class ModelLocationSerializer(serializers.ModelSerializer):
    """One model snapshot cached on one node."""

    node_name = serializers.CharField(source="node.name", read_only=True)
    node_status = serializers.CharField(source="node.status", read_only=True)
    cluster = serializers.UUIDField(source="node.cluster_id", read_only=True)
    cluster_name = serializers.CharField(source="node.cluster.name", read_only=True)

    class Meta:
        model = NodeModel
        fields = [
            "id",
            "model_id",
            "revision",
            "node",
            "node_name",
            "node_status",
            "cluster",
            "cluster_name",
            "path",
            "size_bytes",
            "last_used_at",
            "updated_at",
        ]
        read_only_fields = fields


class EndpointReplicaSerializer(serializers.ModelSerializer):
    """One replica of an endpoint: its server on a node, its requests in flight and completion tokens per second
    summed over every web process (`fleet.replica_load`, a few seconds old at most; null when they cannot be
    read); the requests the router sent it and, of those, its affinity hits (a request whose session or
    prefix key went to this same replica the time before: an estimate of prefix-cache reuse), counted by the
    web processes alive now; `replacement_of` names the lost replica it took over from (every replica is
    listed, retired ones too). A distributed endpoint's replicas are its group's ranks: `group_rank` (0 the
    leader), `group_role`, and the Ray node each runs on with its state now (`ray_node_label`, `ray_node_status`)."""

    node_name = serializers.CharField(source="node.name", read_only=True, default=None)
    in_flight = serializers.SerializerMethodField()
    tokens_per_s = serializers.SerializerMethodField()
    requests_routed = serializers.SerializerMethodField()
    affinity_hits = serializers.SerializerMethodField()
    decision_p50_us = serializers.SerializerMethodField()
    decision_p99_us = serializers.SerializerMethodField()
    adapters = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="The LoRA adapters its server has loaded."
    )

    class Meta:
        model = EndpointReplica
        fields = ["id", "server_id", "node", "node_name", "status", "port", "failure_code", "failure_message"]
        fields += ["adapters"]
        fields += ["in_flight", "tokens_per_s", "requests_routed", "affinity_hits", "decision_p50_us"]
        fields += ["decision_p99_us"]
        fields += ["replacement_of", "group_rank", "group_role", "ray_node", "ray_node_label", "ray_node_status"]
        fields += ["created_at", "updated_at"]
        read_only_fields = fields

    group_role = serializers.CharField(
        read_only=True, help_text='A distributed endpoint\'s rank: "leader" (rank 0, serves the API) or "follower".'
    )
    ray_node_label = serializers.SerializerMethodField(help_text="The rank's Ray node in words (head, worker <id>).")
    ray_node_status = serializers.SerializerMethodField(help_text="The rank's Ray node's state now.")

    def _ray_state(self, obj: EndpointReplica) -> MemberState | None:
        if not obj.ray_node:
            return None
        if "ray_states" not in self.context:  # once per response: every rank listed
            self.context["ray_states"] = {}
        states = self.context["ray_states"]
        if obj.ray_node not in states:
            states.update(group_source().states(ray_nodes=[obj.ray_node]))
        return states.get(obj.ray_node)

    def get_ray_node_label(self, obj: EndpointReplica) -> str | None:
        state = self._ray_state(obj)
        return None if state is None else state.label

    def get_ray_node_status(self, obj: EndpointReplica) -> str | None:
        state = self._ray_state(obj)
        return None if state is None else state.status

    def _load(self, obj: EndpointReplica) -> ReplicaLoad | None:
        """The replica's shared figures (read once per response, kept in the serializer context)."""
        if "replica_loads" not in self.context:
            self.context["replica_loads"] = selectors.replica_loads_shown()
        loads = self.context["replica_loads"]
        return None if loads is None else loads.get(obj.server_id, ReplicaLoad())

    def get_in_flight(self, obj: EndpointReplica) -> int | None:
        load = self._load(obj)
        return None if load is None else load.in_flight

    def get_tokens_per_s(self, obj: EndpointReplica) -> float | None:
        load = self._load(obj)
        return None if load is None else round(load.tokens_per_s, 1)

    def get_requests_routed(self, obj: EndpointReplica) -> int | None:
        load = self._load(obj)
        return None if load is None else load.routed

    def get_affinity_hits(self, obj: EndpointReplica) -> int | None:
        load = self._load(obj)
        return None if load is None else load.affinity_hits

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_decision_p50_us(self, obj: EndpointReplica) -> float | None:
        """The median time (µs) the router took to choose this replica, over the last window."""
        load = self._load(obj)
        return None if load is None else load.decision_p50_us

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_decision_p99_us(self, obj: EndpointReplica) -> float | None:
        load = self._load(obj)
        return None if load is None else load.decision_p99_us


class QueueFiguresSerializer(serializers.Serializer):
    """An endpoint's wait queue over every web process: requests waiting now and its bounds; of the last
    window (REPLICA_LOAD_WINDOW_S, 10 s by default) the requests admitted, their wait p50/p99 (seconds, the
    upper bound of the bucket it falls in; 0 when admitted at once) and the requests refused with 429."""

    waiting = serializers.IntegerField()
    max_depth = serializers.IntegerField()
    max_wait_s = serializers.FloatField()
    admitted = serializers.IntegerField()
    refused = serializers.IntegerField()
    wait_p50_s = serializers.FloatField(allow_null=True)
    wait_p99_s = serializers.FloatField(allow_null=True)


def queue_figures(endpoint: Endpoint, load: QueueLoad) -> dict[str, Any]:
    """`QueueFiguresSerializer`'s fields for `endpoint` from its shared figures."""
    return {
        "waiting": load.waiting,
        "max_depth": endpoint.queue_depth,
        "max_wait_s": endpoint.queue_wait_s,
        "admitted": load.admitted,
        "refused": load.refused,
        "wait_p50_s": load.wait_p50_s,
        "wait_p99_s": load.wait_p99_s,
    }


class EndpointEventSerializer(serializers.ModelSerializer):
    """One line of an endpoint's event log (replicas starting, failing, replaced; the autoscaler's decisions)."""

    node_name = serializers.CharField(source="node.name", read_only=True, default=None)

    class Meta:
        model = EndpointEvent
        fields = ["id", "kind", "message", "data", "node", "node_name", "command", "created_at"]
        read_only_fields = fields


class EndpointSerializer(serializers.ModelSerializer):
    """An inference endpoint, its public URL, its replicas, and on failure the agent's code with `error_help`.

    `status`, `node` and `port` summarise the replicas (the first running one's node and port)."""

    url = serializers.CharField(read_only=True)
    replicas = EndpointReplicaSerializer(many=True, read_only=True)
    node_name = serializers.CharField(source="node.name", read_only=True, default=None)
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)
    error_help = serializers.SerializerMethodField()
    concurrency_limit = serializers.IntegerField(
        read_only=True,
        help_text="Requests in flight per replica the proxy allows (max_concurrency, else the server's "
        "--max-num-seqs, else 256).",
    )
    queue = serializers.SerializerMethodField()

    class Meta:
        model = Endpoint
        fields = [
            "id",
            "slug",
            "url",
            "cluster",
            "node",
            "node_name",
            "model_id",
            "revision",
            "gpus",
            "min_vram_mb",
            "ray_cluster",
            "pipeline_parallel",
            "tensor_parallel",
            "master_port",
            "server_args",
            "status",
            "port",
            "public",
            "min_replicas",
            "max_replicas",
            "target_requests_per_min",
            "target_in_flight",
            "target_tokens_per_s",
            "scale_cooldown_s",
            "scaled_at",
            "idle_timeout_s",
            "idle_since",
            "key_requests_per_min",
            "key_tokens_per_min",
            "routing_policy",
            "target_queued",
            "max_concurrency",
            "queue_max_depth",
            "queue_max_wait_s",
            "concurrency_limit",
            "queue",
            "replicas",
            "failure_code",
            "failure_message",
            "error_help",
            "start_command",
            "stop_command",
            "created_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_error_help(self, obj: Endpoint) -> dict[str, str] | None:
        return error_help(obj.failure_code)

    @extend_schema_field(QueueFiguresSerializer(allow_null=True))
    def get_queue(self, obj: Endpoint) -> dict[str, Any] | None:
        """The endpoint's wait queue now, over every web process (null when the figures cannot be read)."""
        if "queue_loads" not in self.context:
            self.context["queue_loads"] = selectors.queue_loads_shown()
        loads = self.context["queue_loads"]
        if loads is None:
            return None
        return queue_figures(obj, loads.get(str(obj.pk), QueueLoad()))


@extend_schema_field({"type": "array", "items": {"type": "string"}, "maxItems": workload_services.MAX_SERVER_ARGS})
class ServerArgsField(serializers.JSONField):
    """An endpoint's server arguments: a JSON list of strings, checked by `validate_server_args` (the
    protocol's allow-list of vLLM flags, each value by type and range; bounds), `"--max-model-len 2048"` split
    into option and value."""

    def to_internal_value(self, data: Any) -> list[str]:
        try:
            return workload_services.validate_server_args(super().to_internal_value(data))
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict["server_args"]) from None


def _revision(value: str) -> str:
    try:
        return workload_services.validate_revision(value)
    except DjangoValidationError as exc:
        raise serializers.ValidationError(exc.message_dict["revision"]) from None


ROUTING_HELP = (
    "How requests are spread over the replicas: least_load (the fewest in flight), session (the same "
    "X-Session-Id, OpenAI user or API key to the same replica) or prefix (the same leading prompt text to the "
    "same replica); the affinity policies pass a request on when its replica is busier than the rest."
)

# The fields an endpoint hands to every replica's endpoint.start, bounded as the protocol bounds them.
_START = protocol.EndpointStartPayload


class _NoUnknownFields(serializers.Serializer):
    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: "Unknown field." for name in unknown})
        return attrs


ADMISSION_HELP = {
    "max_concurrency": "Requests in flight per replica (null: the server's --max-num-seqs, else 256); more wait.",
    "queue_max_depth": "Requests that may wait for a free slot, over every web process (null: the default; "
    "0: none wait, a request finding every replica full gets 429).",
    "queue_max_wait_s": "Seconds a request may wait (through a cold start too) before it gets 429 (null: the default).",
}
_ADMISSION_BOUNDS = {
    "max_concurrency": (1, workload_services.MAX_CONCURRENCY),
    "queue_max_depth": (0, workload_services.MAX_QUEUE_DEPTH),
    "queue_max_wait_s": (1, workload_services.MAX_QUEUE_WAIT_S),
}


def admission_field(name: str, **kwargs: Any) -> serializers.IntegerField:
    low, high = _ADMISSION_BOUNDS[name]
    return serializers.IntegerField(
        min_value=low, max_value=high, required=False, allow_null=True, help_text=ADMISSION_HELP[name], **kwargs
    )


class EndpointCreateSerializer(serializers.Serializer):
    """Input of POST /endpoints/."""

    cluster = serializers.UUIDField()
    node = serializers.UUIDField(required=False, allow_null=True)
    model_id = payload_field(_START, "model_id")
    revision = payload_field(_START, "revision", validators=[_revision])
    gpus = payload_field(
        _START,
        "gpus",
        help_text="GPUs per replica; 0 still holds one GPU on a node with GPUs (and counts against the quota).",
    )
    min_vram_mb = payload_field(
        _START,
        "min_vram_mb",
        help_text="VRAM (MB) a replica needs at least; the quota counts vLLM's share of its GPUs, never less.",
    )
    public = serializers.BooleanField(required=False, default=False)
    min_replicas = serializers.IntegerField(
        min_value=0,
        max_value=workload_services.MAX_REPLICAS,
        required=False,
        default=1,
        help_text="0: scale to zero after idle_timeout_s without requests; the next request starts it again.",
    )
    max_replicas = serializers.IntegerField(
        min_value=1, max_value=workload_services.MAX_REPLICAS, required=False, allow_null=True, default=None
    )
    target_requests_per_min = serializers.IntegerField(
        min_value=0, max_value=workload_services.MAX_TARGET_REQUESTS_PER_MIN, required=False, default=0
    )
    target_in_flight = serializers.IntegerField(
        min_value=0, max_value=workload_services.MAX_TARGET_IN_FLIGHT, required=False, default=0
    )
    target_tokens_per_s = serializers.IntegerField(
        min_value=0, max_value=workload_services.MAX_TARGET_TOKENS_PER_S, required=False, default=0
    )
    scale_cooldown_s = serializers.IntegerField(
        min_value=0, max_value=workload_services.MAX_SCALE_COOLDOWN_S, required=False, default=120
    )
    idle_timeout_s = serializers.IntegerField(
        min_value=1,
        max_value=workload_services.MAX_IDLE_TIMEOUT_S,
        required=False,
        default=300,
        help_text="Seconds without requests after which an endpoint with min_replicas 0 scales to zero.",
    )
    server_args = ServerArgsField(required=False, default=list)
    key_requests_per_min = serializers.IntegerField(
        min_value=1,
        max_value=workload_services.MAX_PER_MINUTE,
        required=False,
        allow_null=True,
        default=None,
        help_text="Requests a minute each API key (and each member without a key) may make here; null: no limit.",
    )
    key_tokens_per_min = serializers.IntegerField(
        min_value=1,
        max_value=workload_services.MAX_PER_MINUTE,
        required=False,
        allow_null=True,
        default=None,
        help_text="Tokens (prompt and completion) a minute each API key (and each member) may use; null: no limit.",
    )
    routing_policy = serializers.ChoiceField(
        choices=RoutingPolicy.choices, required=False, default=RoutingPolicy.LEAST_LOAD, help_text=ROUTING_HELP
    )
    target_queued = serializers.IntegerField(
        min_value=0,
        max_value=workload_services.MAX_TARGET_IN_FLIGHT,
        required=False,
        default=0,
        help_text="Autoscaling target: requests waiting in the endpoint's queue per replica (0: off).",
    )
    max_concurrency = admission_field("max_concurrency", default=None)
    queue_max_depth = admission_field("queue_max_depth", default=None)
    queue_max_wait_s = admission_field("queue_max_wait_s", default=None)
    ray_cluster = serializers.UUIDField(
        required=False,
        allow_null=True,
        default=None,
        help_text="A running managed Ray cluster of the workspace, instead of a node: one vLLM group across its "
        "Ray nodes (the head's node serves the API).",
    )
    pipeline_parallel = serializers.IntegerField(
        min_value=1,
        max_value=workload_services.MAX_PARALLEL,
        required=False,
        default=1,
        help_text="Pipeline stages, one per Ray node of ray_cluster (head and workers); 1 without one.",
    )
    tensor_parallel = serializers.IntegerField(
        min_value=1,
        max_value=workload_services.MAX_PARALLEL,
        required=False,
        default=1,
        help_text="GPUs each Ray node's rank splits its stage over (1 on nodes without GPUs).",
    )

    def validate_model_id(self, value: str) -> str:
        try:
            return workload_services.validate_model_id(value)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict["model_id"]) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: "Unknown field." for name in unknown})
        return attrs


class EndpointLimitsSerializer(_NoUnknownFields):
    """Input of POST /endpoints/<id>/limits/: the per-key limits (null: no limit; left out: kept)."""

    key_requests_per_min = serializers.IntegerField(
        min_value=1, max_value=workload_services.MAX_PER_MINUTE, required=False, allow_null=True
    )
    key_tokens_per_min = serializers.IntegerField(
        min_value=1, max_value=workload_services.MAX_PER_MINUTE, required=False, allow_null=True
    )


class EndpointAdmissionSerializer(_NoUnknownFields):
    """Input of POST /endpoints/<id>/admission/: the concurrency limit per replica and the queue's bounds
    (null: the default; left out: kept)."""

    max_concurrency = admission_field("max_concurrency")
    queue_max_depth = admission_field("queue_max_depth")
    queue_max_wait_s = admission_field("queue_max_wait_s")


class EndpointRevisionSerializer(serializers.Serializer):
    """Input of POST /endpoints/<id>/update_revision/ (the revision alone; `update/` takes more)."""

    revision = payload_field(_START, "revision", required=True, validators=[_revision])


class EndpointUpdateSerializer(_NoUnknownFields):
    """Input of POST /endpoints/<id>/update/: the new revision and/or server arguments (a rolling update),
    and/or the routing policy (at once, no restart); what is left out is kept."""

    revision = payload_field(_START, "revision", required=False, default=serializers.empty, validators=[_revision])
    server_args = ServerArgsField(required=False)
    routing_policy = serializers.ChoiceField(choices=RoutingPolicy.choices, required=False, help_text=ROUTING_HELP)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if not {"revision", "server_args", "routing_policy"} & set(attrs):
            raise serializers.ValidationError(
                {"revision": "Give a revision and/or server_args to update to (and/or a routing_policy)."}
            )
        return attrs
