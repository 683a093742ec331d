"""An endpoint's server as a process on the node: free and busy ports, whether its pid (and its recorded
port) still runs, its process tree and the signals sent to it, and the tail of its log."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import psutil


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether something answers on 127.0.0.1:`port`."""
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited child not reaped yet) is not alive
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def server_alive(record: dict[str, Any]) -> bool:
    """The recorded server still runs: its pid is alive and its command line still names its port (a
    follower rank's record names the leader's master port instead: `argv_token`)."""
    pid = record.get("pid", 0)
    if not pid_alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust the pid
    return str(record.get("argv_token", record.get("port"))).encode() in argv


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and its living descendants (empty when it is gone)."""
    if not pid_alive(pid):
        return []
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def signal_tree(pgid: int, tree: list[psutil.Process], sig: signal.Signals) -> None:
    """Send `sig` to the server's process group and to each process of its tree (some may have left it)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for proc in tree:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            continue


def log_tail(path: Path, size: int) -> str:
    """The last `size` bytes of the server's log, as text ("" when it cannot be read)."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-size:].decode(errors="replace")
