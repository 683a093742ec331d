"""Ports for the Ray nodes this agent starts: free listen ports and per-node worker port windows.

Listen ports are drawn outside the kernel's ephemeral range (and above Ray's default worker ports), so no
outgoing connection takes one between the check and the server's bind; each node's workers get a random
window of Ray's default worker range, so several Ray nodes on one host network rarely share a port.
"""

from __future__ import annotations

import random
import re
import socket
from collections.abc import Iterable
from pathlib import Path

RAY_WORKER_PORTS = (10002, 19999)  # Ray's default --min-worker-port/--max-worker-port
LISTEN_PORTS_FROM = 20000


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (and for binding port 0)."""
    try:
        low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port(host: str = "127.0.0.1", *, attempts: int = 200) -> int:
    """A TCP port nothing listens on right now, for a server that binds it later.

    Drawn outside the kernel's ephemeral range: a port there can become some outgoing connection's
    source port between this check and the server's bind (a Ray 2.9 raylet died when its runtime-env
    agent's port was taken that way), a port below it cannot. Also above Ray's worker ports (10002-19999).
    Falls back to a kernel-chosen port when none is found.
    """
    low, high = ephemeral_port_range()
    candidates = [
        (start, end)
        for start, end in ((LISTEN_PORTS_FROM, low - 1), (max(LISTEN_PORTS_FROM, high + 1), 65535))
        if start <= end
    ]
    sizes = [end - start + 1 for start, end in candidates]
    for _ in range(attempts if candidates else 0):
        start, _end = random.choices(candidates, weights=sizes)[0]
        port = start + random.randrange(sizes[candidates.index((start, _end))])
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


WORKER_PORT_WINDOW = 1000
WORKER_PORTS_FROM = 11000  # above the bottom of Ray's default range, which every other Ray node walks first


def worker_port_window(size: int = WORKER_PORT_WINDOW, *, avoid: Iterable[int] = ()) -> tuple[int, int] | None:
    """A random range of `size` ports for one Ray node's workers, or None where there is no room for one.

    Every Ray node otherwise hands its workers ports from the same default range (10002-19999), walking it
    from the bottom after a bind check: two nodes on one host network starting workers together give the
    same port to both, and the later worker dies binding it (its actor "died unexpectedly"). A window
    starts at random within Ray's default range (where `free_port` never draws) above its bottom, so
    nodes rarely overlap, and when they do they walk different ports.

    `avoid` are the ports the node itself uses (GCS, dashboard, client server, agent ports…): Ray refuses
    to start when its worker range holds one of them ("worker_ports is trying to use a port number … used
    by other components"), so the window never does.
    """
    last_start = min(RAY_WORKER_PORTS[1] + 1, ephemeral_port_range()[0]) - size
    if last_start < WORKER_PORTS_FROM:
        return None
    # The runs of allowed starts between the avoided ports: a window starting at s holds s..s+size-1.
    runs: list[tuple[int, int]] = []
    start = WORKER_PORTS_FROM
    for port in sorted({p for p in avoid if WORKER_PORTS_FROM <= p <= last_start + size - 1}):
        if port - size >= start:
            runs.append((start, port - size))
        start = max(start, port + 1)
    if start <= last_start:
        runs.append((start, last_start))
    if not runs:
        return None
    weights = [high - low + 1 for low, high in runs]
    low, high = random.choices(runs, weights=weights)[0]
    first = random.randint(low, high)
    return first, first + size - 1


RAY_PORT_REFUSAL = re.compile(
    r"Ray component (?P<component>\w+) is trying to use a port number (?P<port>\d+) that is used by other components"
)


def ray_port_refusal(text: str) -> str | None:
    """A clear message when `text` (a Ray node's output) holds Ray's refusal of a port used twice, else None.

    Ray checks the ports of one node before starting it and refuses when two of its components would share
    one (for instance a worker port window holding the GCS port).
    """
    found = RAY_PORT_REFUSAL.search(text or "")
    if found is None:
        return None
    component, port = found["component"], found["port"]
    what = "its worker port range" if component == "worker_ports" else f"its {component} port"
    return (
        f"Ray refused to start: port {port} is used by another of this Ray node's components and {what} "
        "holds it too (each port may serve one component)"
    )


def port_in_use(port: int, host: str = "0.0.0.0") -> bool:
    """True when something already listens on `port` (so a Ray head cannot bind it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False
