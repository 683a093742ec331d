"""The endpoint manager's records: ``<state_dir>/endpoints.json``, one record per endpoint id (pid, port,
model, log file, where its server runs), replaced atomically on each write, so that an agent restart still
knows its servers; a stopped endpoint's record stays as a tombstone (the newest `STOPPED_KEPT` of them)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_FILE = "endpoints.json"
# Records of stopped endpoints kept, so a repeated stop of one of them answers "stopped" again.
STOPPED_KEPT = 200

Records = dict[str, dict[str, Any]]


def load_records(state_dir: Path) -> Records:
    """The records in `state_dir` ({} when there are none or the file cannot be read)."""
    try:
        return json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def save_records(state_dir: Path, state: Records) -> None:
    """Write `state` as the records in `state_dir`: a whole new file, synced, then renamed over the old one."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as fh:
        json.dump(state, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def forget_old_tombstones(state: Records) -> None:
    """Keep the newest STOPPED_KEPT records of stopped endpoints, so the state file stays small."""
    stopped = sorted(
        (rec.get("stopped_at", 0.0), endpoint_id)
        for endpoint_id, rec in state.items()
        if rec.get("status") == "stopped"
    )
    for _, endpoint_id in stopped[: max(0, len(stopped) - STOPPED_KEPT)]:
        del state[endpoint_id]
