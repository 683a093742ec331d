"""Field validation of the `ray.*` command payloads, plugged into `fleet.payloads` at app start.

`fleet.services.command_dispatch` validates every payload through `fleet.payloads.validate_payload`, which
looks the command type up in `PAYLOAD_SERIALIZERS`; `register()` adds the Ray types there so Ray commands
go through the same dispatch path (and the same final check against `agent.protocol.parse_payload`).
"""

from __future__ import annotations

from rest_framework import serializers

ID_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
VERSION_RE = r"^[0-9]+\.[0-9]+\.[0-9]+$"
RUNTIMES = ["docker", "process", "kuberay"]
# The host name of an in-cluster Service (a KubeRay head), or an IP address.
HOST_RE = r"^[A-Za-z0-9][A-Za-z0-9.:-]*$"


def id_field(**kwargs: object) -> serializers.RegexField:
    """A cluster/member/submission id field (letters, digits, `_.-`; at most 100)."""
    return serializers.RegexField(ID_RE, max_length=100, **kwargs)


def port_field(**kwargs: object) -> serializers.IntegerField:
    """A TCP port field (1-65535)."""
    return serializers.IntegerField(min_value=1, max_value=65535, **kwargs)


class _RayBase(serializers.Serializer):
    cluster_id = id_field()
    member_id = id_field()
    runtime = serializers.ChoiceField(choices=RUNTIMES, required=False)


class RayHeadStartSerializer(_RayBase):
    """ray.head.start (a `gcs_port` of 0: the agent picks a free port on its machine)."""

    ray_version = serializers.RegexField(VERSION_RE, max_length=32)
    image = serializers.CharField(max_length=500)
    gcs_port = serializers.IntegerField(min_value=0, max_value=65535, required=False)
    dashboard_port = port_field(required=False)
    num_cpus = serializers.FloatField(min_value=0, max_value=1024, required=False)
    num_gpus = serializers.IntegerField(min_value=0, max_value=64, required=False)
    # kuberay: the RayCluster's name and its worker group
    name = serializers.RegexField(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=50, required=False)
    min_workers = serializers.IntegerField(min_value=0, max_value=1000, required=False)
    max_workers = serializers.IntegerField(min_value=0, max_value=1000, required=False)
    idle_timeout_s = serializers.IntegerField(min_value=0, max_value=86400, required=False)
    worker_cpus = serializers.FloatField(min_value=0, max_value=1024, required=False)
    worker_memory_mb = serializers.IntegerField(min_value=0, max_value=4 * 1024 * 1024, required=False)
    worker_gpus = serializers.IntegerField(min_value=0, max_value=64, required=False)
    worker_image = serializers.CharField(max_length=500, required=False, allow_blank=True)


class RayWorkerStartSerializer(_RayBase):
    """ray.worker.start."""

    ray_version = serializers.RegexField(VERSION_RE, max_length=32)
    image = serializers.CharField(max_length=500)
    head_address = serializers.RegexField(r"^[A-Za-z0-9_.:\[\]-]+:[0-9]{1,5}$", max_length=300)
    num_cpus = serializers.FloatField(min_value=0, max_value=1024, required=False)
    num_gpus = serializers.IntegerField(min_value=0, max_value=64, required=False)


class RayNodeDrainSerializer(_RayBase):
    """ray.node.drain."""

    ray_node_id = serializers.RegexField(r"^[0-9a-fA-F]+$", max_length=128)
    head_member_id = id_field(required=False, allow_blank=True)
    gcs_port = port_field(required=False)
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True)
    deadline_s = serializers.IntegerField(min_value=0, max_value=3600, required=False)


class RayNodeStopSerializer(_RayBase):
    """ray.node.stop."""

    container = serializers.CharField(max_length=255, required=False, allow_blank=True)
    timeout_s = serializers.IntegerField(min_value=0, max_value=3600, required=False)
    delete = serializers.BooleanField(required=False)


class RayStatusSerializer(_RayBase):
    """ray.status."""

    gcs_port = port_field(required=False)
    include_logs = serializers.BooleanField(required=False)
    log_lines = serializers.IntegerField(min_value=0, max_value=2000, required=False)


RAY_PAYLOAD_SERIALIZERS: dict[str, type[serializers.Serializer]] = {
    "ray.head.start": RayHeadStartSerializer,
    "ray.worker.start": RayWorkerStartSerializer,
    "ray.node.drain": RayNodeDrainSerializer,
    "ray.node.stop": RayNodeStopSerializer,
    "ray.status": RayStatusSerializer,
}


def register() -> None:
    """Make `fleet.payloads.validate_payload` accept the Ray command types (idempotent)."""
    from fleet import payloads

    for command_type, serializer in RAY_PAYLOAD_SERIALIZERS.items():
        payloads.PAYLOAD_SERIALIZERS.setdefault(command_type, serializer)
