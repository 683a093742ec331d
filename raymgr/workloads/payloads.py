"""Field validation of the `ray.job.*` / `ray.serve.status` payloads, plugged into `fleet.payloads`."""

from __future__ import annotations

from rest_framework import serializers

from raymgr.payloads import HOST_RE, RUNTIMES, id_field, port_field

FILE_NAME_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"


class _Base(serializers.Serializer):
    cluster_id = id_field()
    member_id = id_field()
    runtime = serializers.ChoiceField(choices=RUNTIMES, required=False)
    dashboard_port = port_field(required=False)
    host = serializers.RegexField(HOST_RE, max_length=253, required=False, allow_blank=True)


class RayJobSubmitSerializer(_Base):
    """ray.job.submit."""

    submission_id = id_field()
    entrypoint = serializers.CharField(max_length=4000)
    files = serializers.DictField(
        child=serializers.CharField(max_length=200_000, allow_blank=True, trim_whitespace=False), required=False
    )
    runtime_env = serializers.DictField(required=False)
    entrypoint_num_cpus = serializers.FloatField(min_value=0, max_value=1024, required=False)
    entrypoint_num_gpus = serializers.FloatField(min_value=0, max_value=64, required=False)
    metadata = serializers.DictField(child=serializers.CharField(max_length=500, allow_blank=True), required=False)

    def validate_files(self, value: dict[str, str]) -> dict[str, str]:
        import re

        bad = [name for name in value if not re.match(FILE_NAME_RE, name)]
        if bad:
            raise serializers.ValidationError(f"Bad file name(s): {', '.join(sorted(bad))}")
        return value


class RayJobRefSerializer(_Base):
    """ray.job.status / ray.job.stop."""

    submission_id = id_field()
    log_lines = serializers.IntegerField(min_value=0, max_value=5000, required=False)


class RayServeStatusSerializer(_Base):
    """ray.serve.status."""

    app_name = serializers.CharField(max_length=100, required=False, allow_blank=True)
    log_lines = serializers.IntegerField(min_value=0, max_value=2000, required=False)


SERIALIZERS: dict[str, type[serializers.Serializer]] = {
    "ray.job.submit": RayJobSubmitSerializer,
    "ray.job.status": RayJobRefSerializer,
    "ray.job.stop": RayJobRefSerializer,
    "ray.serve.status": RayServeStatusSerializer,
}


def register() -> None:
    """Make `fleet.payloads.validate_payload` accept the workload command types (idempotent)."""
    from fleet import payloads

    for command_type, serializer in SERIALIZERS.items():
        payloads.PAYLOAD_SERIALIZERS.setdefault(command_type, serializer)
