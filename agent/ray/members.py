"""How the agent names the Ray nodes it runs, and the cluster status in the shape the control plane stores.

Every Ray node is named ``ray-<member_id>`` (the control plane's RayNode id): container name and Ray node
label, so status reports map back to control-plane rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent import protocol

NAME_PREFIX = "ray-"
# Where Ray keeps logs: <temp dir>/session_latest/logs (process: our --temp-dir; docker: /tmp/ray).
CONTAINER_RAY_DIR = "/tmp/ray"
LOG_FILES = {"gcs": "gcs_server.out", "autoscaler": "monitor.log"}


def member_name(member_id: str) -> str:
    """Container name and Ray node label of a control-plane Ray node."""
    return f"{NAME_PREFIX}{member_id}"


def member_of(label: str | None) -> str:
    """The member id in a Ray node label we set ('' for nodes we did not start)."""
    return label[len(NAME_PREFIX) :] if label and label.startswith(NAME_PREFIX) else ""


def normalize_status(status: dict[str, Any]) -> protocol.RayStatusResult:
    """`RayClusterStatus.as_dict()` as the `ray.status` result the control plane stores
    (`ray_cluster_record_status`)."""
    nodes = [
        protocol.RayStatusNode(
            ray_node_id=node.get("node_id", ""),
            member_id=member_of(node.get("name")),
            is_head=bool(node.get("is_head")),
            alive=True,
            status=node.get("status", ""),
            idle_s=float(node.get("idle_s", 0.0)),
            resources=node.get("resources", {}),
            available=node.get("available", {}),
            ip=node.get("ip_address", ""),
        )
        for node in status.get("nodes", [])
    ]
    demand = status.get("demand", {})
    return protocol.RayStatusResult(
        nodes=nodes,
        pending=demand.get("bundles", []),
        head_free=status.get("head_free", {}),
        placement_groups=demand.get("placement_groups", []),
        truncated=bool(demand.get("truncated", False)),
    )


# C0 control characters but tab, newline and carriage return: a log read while Ray writes it may hold NULs,
# which the control plane's database cannot store (PostgreSQL text and jsonb hold no NUL).
_CONTROLS = dict.fromkeys(c for c in range(32) if chr(c) not in "\t\n\r")


def log_text(text: str) -> str:
    """`text` without its control characters (tab, newline and carriage return kept)."""
    return text.translate(_CONTROLS)


def tail_lines(text: str, lines: int) -> str:
    """The last `lines` lines of `text` ('' for none), without control characters (`log_text`)."""
    return log_text("\n".join(text.splitlines()[-lines:])) if lines else ""


def read_text(path: Path) -> str:
    """The text of `path`, '' when it cannot be read."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
