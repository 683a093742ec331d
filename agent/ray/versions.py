"""What differs between the Ray releases a cluster may run: ``--labels`` syntax and racy agent ports."""

from __future__ import annotations


def labels_need_json(version: str) -> bool:
    """True for Ray releases whose ``ray start --labels`` takes a JSON object (before 2.45)."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < (2, 45)


AGENT_PORTS = ("dashboard_agent_grpc", "runtime_env_agent", "metrics_export")


def agent_ports_need_pinning(version: str) -> bool:
    """True for Ray releases that pick their agents' ports themselves in a racy way (before 2.60).

    Ray 2.9 draws the dashboard agent's gRPC, the runtime-env agent's and the metrics export ports at
    random from the ephemeral range, checks them free and binds them seconds later: on a shared host
    network another process can take one meanwhile (the raylet then dies: "Runtime Env Agent timed out").
    Ray 2.60 binds port 0 and publishes what it got, so it is left to do so. Both take the flags.
    """
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return True
    return (major, minor) < (2, 60)
