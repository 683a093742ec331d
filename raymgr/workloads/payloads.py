"""The Ray workload command types (`ray.job.*`, `ray.serve.status`), accepted by the API at app start.

Their validation is derived from `agent.protocol`'s payload dataclasses, like every command's.
"""

from __future__ import annotations

WORKLOAD_COMMAND_TYPES = ("ray.job.submit", "ray.job.status", "ray.job.stop", "ray.serve.status")


def register() -> None:
    """Make `fleet.payloads.validate_payload` accept the workload command types (idempotent)."""
    from fleet import payloads

    payloads.register_payload_types(WORKLOAD_COMMAND_TYPES)
