"""The command journal: the outcome of every finished command, one JSON line each, fsync'd.

A command re-delivered with a finished idempotency key is answered from the journal without running
the work again, also after an agent restart (`CommandJournal.load`). A torn last line, from a crash
mid-write, is skipped: that command was not finished.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from agent.protocol import Error, Result

log = logging.getLogger(__name__)
# The journal's file name in the agent's work directory.
JOURNAL_FILE = "journal.jsonl"


def journal_path(work_dir: Path) -> Path:
    """Where the journal of the agent working in `work_dir` lies."""
    return Path(work_dir) / JOURNAL_FILE


def journal_load(path: Path) -> dict[str, Result | Error]:
    """The outcome of every finished idempotency key in the journal at `path`, in journal order."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return {}
    done: dict[str, Result | Error] = {}
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
            if entry["kind"] == "result":
                outcome: Result | Error = Result(command_id=entry["command_id"], data=entry.get("data", {}))
            else:
                outcome = Error(
                    command_id=entry["command_id"],
                    code=entry["code"],
                    message=entry["message"],
                    data=entry.get("data", {}),
                )
        except (ValueError, KeyError, TypeError):
            # A torn last line from a crash mid-write: that command was not finished.
            log.warning("skipping unreadable journal line %d in %s", number, path)
            continue
        done[entry["key"]] = outcome
    return done


def journal_append(path: Path, key: str, command_type: str, outcome: Result | Error) -> None:
    """Append one outcome to the journal at `path` and fsync it."""
    entry: dict[str, Any] = {"key": key, "command_type": command_type, "command_id": outcome.command_id}
    entry["at"] = time.time()
    if isinstance(outcome, Result):
        entry.update(kind="result", data=outcome.data)
    else:
        entry.update(kind="error", code=outcome.code, message=outcome.message, data=outcome.data)
    line = json.dumps(entry, separators=(",", ":"), default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class CommandJournal:
    """One journal file, appended to from any thread (one line at a time)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def load(self) -> dict[str, Result | Error]:
        """Every finished key's outcome (see `journal_load`)."""
        return journal_load(self.path)

    def append(self, key: str, command_type: str, outcome: Result | Error) -> None:
        """Append and fsync one outcome."""
        with self._lock:
            journal_append(self.path, key, command_type, outcome)
