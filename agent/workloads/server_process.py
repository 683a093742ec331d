"""An endpoint's server as a process on the node: free and busy ports, whether its pid (and its recorded
port) still runs, its process tree and the signals sent to it, the tail of its log, and `ProcessHost`, the
process path of `agent.workloads.server_host.ServerHost`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from agent.workloads.cpu_cores import pin_process
from agent.workloads.engine import Engine
from agent.workloads.server_host import Launch


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


class ProcessHost:
    """Servers as child processes of the agent, each in a session of its own (`ServerHost`)."""

    local = True

    def __init__(self) -> None:
        self.children: dict[int, subprocess.Popen[bytes]] = {}  # reaped when they are stopped

    def prepare(self, engine: Engine, model_path: Path) -> tuple[Engine, Path]:
        """The engine and model path as they are: the server runs on this node."""
        return engine, model_path

    def start(self, launch: Launch) -> subprocess.Popen[bytes]:
        """Spawn the server in a new session, its output in its log, bound to its cores when there are any."""
        with launch.log_path.open("wb") as log:
            child = subprocess.Popen(
                launch.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=launch.env,
                start_new_session=True,
            )
        self.children[child.pid] = child
        if launch.cores:
            pin_process(child.pid, launch.cores)
        return child

    def fields(self) -> dict[str, Any]:
        """Nothing: a record without a container is a process of this node."""
        return {}

    def alive(self, record: dict[str, Any]) -> bool:
        """`server_alive`."""
        return server_alive(record)

    def owns(self, pid: int) -> bool:
        """Whether `pid` is a child this host started and has not reaped yet."""
        return pid in self.children

    def stop(self, pid: int, *, timeout_s: float) -> None:
        """End the server's whole process tree: its process group and every descendant (SIGTERM and SIGCONT,
        then SIGKILL after `timeout_s`), so no engine process is left behind with parent 1; a stopped
        (SIGSTOP) process is woken to take its SIGTERM, and SIGKILL ends it regardless."""
        child = self.children.pop(pid, None)
        tree = process_tree(pid)
        if not tree:
            if child is not None:
                child.wait()
            return
        signal_tree(pid, tree, signal.SIGTERM)
        signal_tree(pid, tree, signal.SIGCONT)  # a stopped (SIGSTOP) or hung-in-stop process acts on its SIGTERM
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if child is not None:
                child.poll()  # reap the server itself, or it stays a zombie
            tree = [p for p in tree if pid_alive(p.pid)]
            if not tree:
                break
            time.sleep(0.05)
        if tree:
            signal_tree(pid, tree, signal.SIGKILL)
        if child is not None:
            child.wait()
        psutil.wait_procs([p for p in tree if p.pid != pid], timeout=5)
