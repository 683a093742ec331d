"""A command's result in a few words, for the Result column of Recent commands.

An agent answers each command with a small JSON object (`Command.result`): a downloaded model's id, size
and file count; a container's name, state and id; an endpoint's port; a Ray job's submission id and
status. `result_summary` keeps the telling values, in a fixed order, each in a short phrase, and leaves
out logs, paths and process ids (they belong on the node's event log and the workload pages).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.template.defaultfilters import filesizeformat

MAX_PARTS = 4
MAX_VALUE_CHARS = 60
# Values no summary shows: long text, local paths and details of the process.
SKIPPED = frozenset(
    {
        *("log_tail", "logs", "traceback", "markers", "replica_logs", "message"),
        *("path", "pid", "commit", "revision", "head_free", "start_time", "end_time", "dashboard_url"),
    }
)


def _flag(label: str) -> Callable[[Any], str]:
    return lambda value: label if value else ""


# key → how its value reads; keys are shown in this order, then any other plain value as "key value".
PHRASES: dict[str, Callable[[Any], str]] = {
    "model_id": str,
    "name": str,
    "status": lambda v: str(v).lower(),
    "stopped": lambda v: "stopped" if v else "not stopped",
    "reason": str,
    "container_id": lambda v: f"id {str(v)[:12]}",
    "endpoint_id": lambda v: f"endpoint {v}",
    "port": lambda v: f"port {v}",
    "http_port": lambda v: f"port {v}",
    "device": str,
    "submission_id": lambda v: f"job {v}",
    "gcs_address": lambda v: f"GCS {v}",
    "size_bytes": lambda v: filesizeformat(v),
    "files": lambda v: f"{v} files",
    "version": lambda v: f"version {v}",
    "existed": _flag("already there"),
    "already_running": _flag("already running"),
    "already_submitted": _flag("already submitted"),
    "accepted": lambda v: "accepted" if v else "refused",
}


def _phrase(key: str, value: Any) -> str:
    if value in (None, "", [], {}):
        return ""
    if isinstance(value, list | dict):
        return f"{len(value)} {key.replace('_', ' ')}"
    if isinstance(value, bool) and key not in PHRASES:
        return key.replace("_", " ") if value else ""
    text = PHRASES[key](value) if key in PHRASES else f"{key.replace('_', ' ')} {value}"
    text = str(text)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def result_summary(result: dict[str, Any] | None) -> str:
    """Up to four short phrases joined by " · " ("acme/tiny · 4.0 KB · 2 files"); "" for no result."""
    if not isinstance(result, dict):
        return ""
    keys = [k for k in PHRASES if k in result] + [k for k in result if k not in PHRASES and k not in SKIPPED]
    parts = []
    for key in keys:
        text = _phrase(key, result[key])
        if key == "model_id" and text and result.get("revision") not in (None, "", "main"):
            text += f"@{result['revision']}"
        if text:
            parts.append(text)
        if len(parts) == MAX_PARTS:
            break
    return " · ".join(parts)
