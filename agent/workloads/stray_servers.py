"""Endpoint servers this agent started but no longer owns: each server carries its endpoint id and the
agent's state directory in its environment, so a server outside the agent's records (a start whose record
was lost, an engine process whose server was killed) is still found, reported in the inventory as
`stray` (the control plane ends it with endpoint.stop of its id) and ended by that stop."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

ENDPOINT_ID_ENV = "CLEVERTHIS_ENDPOINT_ID"
STATE_DIR_ENV = "CLEVERTHIS_ENDPOINT_STATE"


@dataclass(frozen=True)
class ServerProcess:
    """A server process tree's root carrying this agent's mark."""

    pid: int
    endpoint_id: str
    model_id: str
    port: int


def mark_env(env: dict[str, str], *, endpoint_id: str, state_dir: Path) -> dict[str, str]:
    """The server's environment with the mark that makes it findable (`marked_servers`)."""
    return {**env, ENDPOINT_ID_ENV: endpoint_id, STATE_DIR_ENV: str(Path(state_dir).resolve())}


def _flag(argv: list[str], name: str) -> str:
    try:
        return argv[argv.index(name) + 1]
    except (ValueError, IndexError):
        return ""


def marked_servers(state_dir: Path) -> list[ServerProcess]:
    """The roots of the process trees marked by this state directory: marked processes whose parent is not
    marked by it (a server, or an engine process left behind by its killed server)."""
    wanted = str(Path(state_dir).resolve())
    marked: dict[int, tuple[str, list[str], int]] = {}
    for proc in psutil.process_iter(["pid", "ppid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get(STATE_DIR_ENV) == wanted and env.get(ENDPOINT_ID_ENV):
            marked[proc.info["pid"]] = (env[ENDPOINT_ID_ENV], proc.info["cmdline"] or [], proc.info["ppid"])
    found = []
    for pid, (endpoint_id, argv, ppid) in sorted(marked.items()):
        if ppid in marked:
            continue
        port = _flag(argv, "--port")
        found.append(
            ServerProcess(
                pid=pid,
                endpoint_id=endpoint_id,
                model_id=_flag(argv, "--served-model-name"),
                port=int(port) if port.isdigit() else 0,
            )
        )
    return found
