"""The Ray workload command types (`ray.job.*`, `ray.serve.status`), accepted by the API at app start.

Their validation is derived from `agent.protocol`'s payload dataclasses, like every command's.
"""

from __future__ import annotations

from agent import protocol

# Only raymgr's workload services send them (to the head of a managed Ray cluster, recorded on their rows).
OWNER_API = "the Ray workload API (/api/v1/ray/training-jobs/, /api/v1/ray/tune-experiments/, /api/v1/ray/deployments/)"


def register() -> None:
    """Make `fleet.payloads.validate_payload` accept the workload command types (idempotent)."""
    from fleet import payloads

    payloads.register_payload_types(protocol.RAY_JOB_COMMAND_TYPES, owner_api=OWNER_API)
