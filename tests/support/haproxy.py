"""A real HAProxy in front of web processes on this machine, with the compose stack's backend settings.

The backend's directives (balance, health checks, retry-on, which requests may be retried) are read
from deploy/compose/haproxy.cfg, so the tests and the roll bench exercise what is deployed; only the
servers differ: fixed 127.0.0.1 ports instead of DNS. No TLS (plain HTTP on a local port). The admin
socket answers `show stat` (`servers_up`).
"""

from __future__ import annotations

import csv
import io
import shutil
import socket
from pathlib import Path

from tests.support.processes import REPO_ROOT, ManagedProcess, free_port, port_open, wait_until

COMPOSE_CONFIG = REPO_ROOT / "deploy" / "compose" / "haproxy.cfg"


def available() -> bool:
    """Whether an haproxy binary is installed (.ci/setup installs Debian's)."""
    return shutil.which("haproxy") is not None


def backend_directives() -> list[str]:
    """The compose stack's `backend web` directives, without its servers and their DNS settings."""
    lines, inside = [], False
    for raw in COMPOSE_CONFIG.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if raw and not raw[0].isspace():
            inside = line == "backend web"
            continue
        if inside and line and not line.startswith(("server-template", "default-server")):
            lines.append(line)
    return lines


class LoadBalancer:
    """HAProxy on 127.0.0.1:`port` balancing over web processes at `servers` ports (started or not)."""

    def __init__(self, log_dir: Path, servers: list[int]) -> None:
        self.port = free_port()
        self.socket_path = log_dir / "haproxy.sock"
        config = "\n".join(
            [
                "global",
                f"    stats socket {self.socket_path} level admin",
                "defaults",
                "    mode http",
                "    timeout connect 2s",
                "    retries 3",
                "    option redispatch 1",
                "    timeout client 65s",
                "    timeout server 310s",
                "    timeout tunnel 1h",
                "frontend plain",
                f"    bind 127.0.0.1:{self.port}",
                "    option forwardfor",
                "    default_backend web",
                "backend web",
                *(f"    {line}" for line in backend_directives()),
                # as deployed (checks every second, two to fall or rise), at fixed addresses
                "    default-server check inter 1s fall 2 rise 2",
                *(f"    server web{i} 127.0.0.1:{port}" for i, port in enumerate(servers)),
                "",
            ]
        )
        self.config_path = log_dir / "haproxy.cfg"
        self.config_path.write_text(config)
        self.process = ManagedProcess("haproxy", ["haproxy", "-db", "-f", str(self.config_path)], log_dir=log_dir)
        wait_until(lambda: port_open(self.port) or not self.process.alive(), timeout=15, what="haproxy listening")
        assert self.process.alive(), self.process.log()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> list[dict[str, str]]:
        """`show stat` of the web backend's servers."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(b"show stat\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        text = b"".join(chunks).decode().lstrip("# ")
        rows = csv.DictReader(io.StringIO(text))
        return [row for row in rows if row["pxname"] == "web" and row["svname"] not in ("BACKEND", "FRONTEND")]

    def servers_up(self) -> set[str]:
        """The names of the servers HAProxy sends new requests to."""
        return {row["svname"] for row in self.stats() if row["status"] == "UP"}

    def stop(self) -> None:
        self.process.stop()
