"""The `ray.*` node command types, accepted by the API (`fleet.payloads`) at app start.

Their validation is derived from `agent.protocol`'s payload dataclasses, like every command's.
"""

from __future__ import annotations

from agent import protocol

# Only raymgr's services send them (admitted against the quotas, placed, recorded on the Ray cluster's rows).
OWNER_API = "the Ray cluster API (POST /api/v1/ray/clusters/, then /start/, /stop/ or PATCH to scale)"


def register() -> None:
    """Make `fleet.payloads.validate_payload` accept the Ray command types, sent by raymgr only (idempotent)."""
    from fleet import payloads

    payloads.register_payload_types(protocol.RAY_NODE_COMMAND_TYPES, owner_api=OWNER_API)
