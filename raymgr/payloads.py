"""The `ray.*` node command types, accepted by the API (`fleet.payloads`) at app start.

Their validation is derived from `agent.protocol`'s payload dataclasses, like every command's.
"""

from __future__ import annotations

from agent import protocol


def register() -> None:
    """Make `fleet.payloads.validate_payload` accept the Ray command types (idempotent)."""
    from fleet import payloads

    payloads.register_payload_types(protocol.RAY_NODE_COMMAND_TYPES)
