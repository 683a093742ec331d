"""Simulated hosts for end-to-end tests: Linux network namespaces on one bridge, each with its own Podman.

`simulated_hosts(n, log_dir)` (root only) creates `n` network namespaces with names unique to the run, a
bridge in the root namespace holding the first free 10.213.<k>.0/24 subnet's address .254 (the address a
control plane listens on for them), and a veth pair per namespace: host i is 10.213.<k>.<i+1>, with loopback
up and its default route via the bridge, so a process in it (Ray's node-IP detection included) sees one
non-loopback address, as on a separate machine. Each host runs its own `podman system service` (a socket of
its own, the storage and configuration of `.ci/podman-setup`): containers it starts with the host network
share that host's namespace. Everything is torn down on exit, failure included (containers are the
caller's to remove first; then what is left in a namespace is ended, as a namespace lives on while a
process is in it), and the teardown checks that no namespace, bridge or veth of the run remains.

Processes enter a namespace with ``nsenter --net=/run/netns/<name>``, not ``ip netns exec``: the latter
also unshares the mount namespace and remounts /sys, hiding the cgroup mount runc needs (every container
start then fails with "no cgroup mount found in mountinfo"); entering the network namespace only keeps
the mounts (and Podman's storage) shared with the root namespace.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.agent.executors.podman import STATE_DIR as PODMAN_DIR
from tests.support.podman_env import podman_env
from tests.support.processes import ManagedProcess, wait_until

NETNS_DIR = Path("/run/netns")
SUBNETS = "10.213.{}.0/24"  # an unlikely private range; the first /24 no interface here overlaps is used


@dataclass
class SimulatedHost:
    """One network namespace with an address on the bridge and (once started) a Podman service."""

    netns: str
    address: str
    socket: Path
    podman_service: ManagedProcess | None = None

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host's network namespace."""
        return ["nsenter", f"--net={NETNS_DIR / self.netns}", *argv]

    @property
    def docker_host(self) -> str:
        """DOCKER_HOST for an agent on this host: its own Podman service's Docker API."""
        return f"unix://{self.socket}"

    def podman(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The podman CLI as a client of this host's service (what runs, runs in this host's namespace)."""
        done = subprocess.run(
            ["podman", "--url", self.docker_host, *args],
            env=podman_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} on {self.netns} failed: {done.stderr[-2000:]}")
        return done

    def runs(self, pid: int) -> bool:
        """True when process `pid` (a container's, say) is in this host's network namespace."""
        try:
            return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(NETNS_DIR / self.netns).st_ino
        except OSError:
            return False

    def pids(self) -> list[int]:
        """The processes in this host's network namespace."""
        try:
            inode = os.stat(NETNS_DIR / self.netns).st_ino
        except OSError:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(entry / "ns" / "net").st_ino == inode:
                        found.append(int(entry.name))
        return found

    def stop_processes(self, timeout: float = 3) -> None:
        """End what is still in this namespace once its containers are gone: Podman's exec-session monitors
        (conmon waits `exit_command_delay`, 300 s, after each exec before cleaning up) would otherwise hold
        the namespace, and its veth, for minutes. Only processes of this namespace, which this run made."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            with contextlib.suppress(TimeoutError):
                wait_until(lambda: not self.pids(), timeout=timeout, interval=0.2, what=f"{self.netns} empty")
                return

    def decoy_default_route(self, address: str = "172.31.213.1/24") -> str:
        """Send this host's default route over a second interface (holding `address`), as on a
        machine whose default route is a management network while its peers are on the bridge; return
        the decoy's address (what a default-route address pick finds here)."""
        ip_only = address.split("/", 1)[0]
        # A veth pair with both ends in the namespace (no `dummy` kernel module is needed), the far end dangling.
        _ip("-n", self.netns, "link", "add", "decoy0", "type", "veth", "peer", "name", "decoy1")
        _ip("-n", self.netns, "addr", "add", address, "dev", "decoy0")
        _ip("-n", self.netns, "link", "set", "decoy1", "up")
        _ip("-n", self.netns, "link", "set", "decoy0", "up")
        _ip("-n", self.netns, "route", "replace", "default", "dev", "decoy0")
        return ip_only


@dataclass
class SimulatedNetwork:
    """The bridge (in the root namespace) and the hosts on it."""

    bridge: str
    bridge_address: str
    hosts: list[SimulatedHost] = field(default_factory=list)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def unavailable_reason() -> str | None:
    """Why network namespaces with a bridge cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces, a bridge, veth pairs)"
    for tool in ("ip", "nsenter", "podman"):
        if shutil.which(tool) is None:
            return f"simulated hosts need `{tool}`"
    probe = f"ctprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    bridge = _ip("link", "add", probe, "type", "bridge", check=False)
    if bridge.returncode != 0:
        return f"creating a bridge is not permitted here: {bridge.stderr.strip()}"
    _ip("link", "del", probe, check=False)
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    used = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines() + _ip("-4", "route", "show").stdout.splitlines():
        for word in line.split():
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(word, strict=False))
    for k in range(1, 255):
        net = ipaddress.ip_network(SUBNETS.format(k))
        if not any(net.overlaps(other) for other in used if other.prefixlen > 0):
            return net
    raise RuntimeError("no free 10.213.<k>.0/24 subnet for the simulated hosts")


def _service_up(host: SimulatedHost) -> bool:
    if not host.socket.is_socket():
        return False
    return host.podman("version", "--format", "{{.Server.Version}}", check=False).returncode == 0


@contextlib.contextmanager
def simulated_hosts(count: int, log_dir: Path) -> Iterator[SimulatedNetwork]:
    """`count` hosts on one bridge, each with its own Podman service; all removed on exit."""
    run = uuid.uuid4().hex[:6]
    net = _free_subnet()
    addresses = list(net.hosts())
    network = SimulatedNetwork(bridge=f"ctbr{run}", bridge_address=str(addresses[-1]))
    made_netns: list[str] = []
    bridge_made = False
    try:
        _ip("link", "add", network.bridge, "type", "bridge")
        bridge_made = True
        _ip("addr", "add", f"{network.bridge_address}/{net.prefixlen}", "dev", network.bridge)
        _ip("link", "set", network.bridge, "up")
        for i in range(count):
            name = f"ct{run}h{i}"
            _ip("netns", "add", name)
            made_netns.append(name)
            outer, inner = f"ct{run}v{i}", f"ct{run}p{i}"
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", name)
            _ip("link", "set", outer, "master", network.bridge, "up")
            _ip("-n", name, "addr", "add", f"{addresses[i]}/{net.prefixlen}", "dev", inner)
            _ip("-n", name, "link", "set", inner, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "route", "add", "default", "via", network.bridge_address)
            host = SimulatedHost(netns=name, address=str(addresses[i]), socket=PODMAN_DIR / f"podman-{name}.sock")
            network.hosts.append(host)
        for host in network.hosts:
            host.socket.unlink(missing_ok=True)
            # From the Podman state dir, as .ci/podman-setup: conmon needs a working directory that outlives us.
            host.podman_service = ManagedProcess(
                f"podman-{host.netns}",
                host.argv(["podman", "system", "service", "--time=0", host.docker_host]),
                log_dir=log_dir,
                env={k: v for k, v in podman_env().items() if k.startswith("CONTAINERS_")},
                cwd=PODMAN_DIR,
            )
        for host in network.hosts:
            wait_until(lambda h=host: _service_up(h), timeout=60, interval=0.3, what=f"podman service in {host.netns}")
        yield network
    finally:
        for host in network.hosts:
            if host.podman_service is not None:
                host.podman_service.stop()
            host.socket.unlink(missing_ok=True)
        for host in network.hosts:
            host.stop_processes()
        for name in made_netns:  # a namespace with no process left goes with its end of the veth pair, hence both
            _ip("netns", "del", name, check=False)
        if bridge_made:
            _ip("link", "del", network.bridge, check=False)

        def leftover() -> list[str]:
            names = [name for name in made_netns if (NETNS_DIR / name).exists()]
            links = _ip("-o", "link", "show").stdout.splitlines()
            return names + [line for line in links if f"ct{run}" in line or network.bridge in line]

        # The kernel frees a deleted namespace (and its veth pairs) asynchronously.
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not leftover(), timeout=30, interval=0.2, what="the simulated hosts' links gone")
        assert not leftover(), f"simulated hosts left behind: {leftover()}"
