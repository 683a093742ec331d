"""Serializers for the Ray API: read shapes and write inputs (inputs only parse; services validate)."""

from __future__ import annotations

from rest_framework import serializers

from raymgr.models import RayCluster, RayClusterEvent, RayNode, RayRuntime


def dashboard_path(cluster: RayCluster) -> str:
    """Where the Ray dashboard of `cluster` is proxied through the tunnel."""
    return f"/ray/clusters/{cluster.pk}/dashboard/"


class RayClusterSerializer(serializers.ModelSerializer):
    """A Ray cluster as listed and inspected."""

    compute_cluster_name = serializers.CharField(source="compute_cluster.name", read_only=True)
    head_node_name = serializers.SerializerMethodField()
    dashboard_url = serializers.SerializerMethodField()

    class Meta:
        model = RayCluster
        fields = [
            "id",
            "workspace",
            "compute_cluster",
            "compute_cluster_name",
            "name",
            "ray_version",
            "runtime",
            "min_workers",
            "max_workers",
            "idle_timeout_s",
            "worker_cpus",
            "worker_memory_mb",
            "worker_gpus",
            "checkpoint_on_stop",
            "serves_vllm",
            "status",
            "status_changed_at",
            "failure_reason",
            "head_node",
            "head_node_name",
            "head_hostname",
            "head_ip",
            "head_container_id",
            "gcs_port",
            "head_gcs_port",
            "dashboard_port",
            "dashboard_url",
            "created_at",
            "started_at",
        ]
        read_only_fields = fields

    def get_head_node_name(self, obj: RayCluster) -> str:
        return obj.head_node.name if obj.head_node else ""

    def get_dashboard_url(self, obj: RayCluster) -> str:
        return dashboard_path(obj)


class RayClusterCreateSerializer(serializers.Serializer):
    """POST /ray/clusters/."""

    workspace = serializers.UUIDField()
    compute_cluster = serializers.UUIDField()
    name = serializers.CharField(max_length=63)
    ray_version = serializers.CharField(
        max_length=32, required=False, default=None, help_text="One of RAY_VERSIONS; omitted: the runtime's default."
    )
    runtime = serializers.ChoiceField(choices=RayRuntime.choices, required=False, default=RayRuntime.DOCKER)
    min_workers = serializers.IntegerField(min_value=0, max_value=1000, required=False, default=0)
    max_workers = serializers.IntegerField(min_value=0, max_value=1000, required=False, default=10)
    idle_timeout_s = serializers.IntegerField(min_value=1, max_value=86400, required=False, default=60)
    gcs_port = serializers.IntegerField(
        min_value=1,
        max_value=65535,
        required=False,
        allow_null=True,
        default=None,
        help_text="Omitted or null: the head's node picks a free port at each start (head_gcs_port tells which).",
    )
    dashboard_port = serializers.IntegerField(min_value=1, max_value=65535, required=False, default=8265)
    checkpoint_on_stop = serializers.BooleanField(required=False, default=False)
    serves_vllm = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Docker runtime: its containers run the Ray image carrying vLLM (RAY_VLLM_VERSIONS pairs the "
        "versions); a distributed endpoint's ranks then run inside them.",
    )
    worker_cpus = serializers.FloatField(min_value=0.1, max_value=1024, required=False, default=1.0)
    worker_memory_mb = serializers.IntegerField(min_value=256, max_value=4 * 1024 * 1024, required=False, default=2048)
    worker_gpus = serializers.IntegerField(min_value=0, max_value=64, required=False, default=0)


class RayClusterUpdateSerializer(serializers.Serializer):
    """PATCH /ray/clusters/<id>/."""

    ray_version = serializers.CharField(max_length=32, required=False)
    min_workers = serializers.IntegerField(min_value=0, max_value=1000, required=False)
    max_workers = serializers.IntegerField(min_value=0, max_value=1000, required=False)
    idle_timeout_s = serializers.IntegerField(min_value=1, max_value=86400, required=False)
    checkpoint_on_stop = serializers.BooleanField(required=False)


class RayNodeSerializer(serializers.ModelSerializer):
    """A head or worker with its latest usage."""

    node_name = serializers.CharField(source="node.name", read_only=True)
    hostname = serializers.CharField(source="node.hostname", read_only=True)

    class Meta:
        model = RayNode
        fields = [
            "id",
            "role",
            "status",
            "status_changed_at",
            "failure_reason",
            "node",
            "node_name",
            "hostname",
            "container_id",
            "ray_node_id",
            "ip",
            "cpu_percent",
            "memory_percent",
            "gpu_count",
            "vram_used_mb",
            "vram_total_mb",
            "running_tasks",
            "idle_s",
            "resources",
            "created_at",
        ]
        read_only_fields = fields


class RayClusterEventSerializer(serializers.ModelSerializer):
    """One event of a Ray cluster."""

    class Meta:
        model = RayClusterEvent
        fields = ["id", "kind", "message", "data", "created_at"]
        read_only_fields = fields
