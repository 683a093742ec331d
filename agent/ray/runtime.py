"""The Ray runtimes' building blocks under one name, for callers written before they were split.

Where each lives: ports (`agent.ray.ports`), the ``ray start`` command line (`agent.ray.start_args`),
the `process` runtime (`agent.ray.process_runtime`), cluster status and drains through the GCS
(`agent.ray.gcs`), release quirks (`agent.ray.versions`) and the docker runtime's container
(`agent.ray.docker_spec`). New code imports from those modules.
"""

from __future__ import annotations

from agent.ray.docker_spec import DEFAULT_PORTS, docker_run_spec
from agent.ray.gcs import (
    DRAIN_REASONS,
    HEAD_RESOURCE,
    NODE_LABEL,
    PendingDemand,
    RayClusterStatus,
    RayNodeStatus,
    cluster_status,
    drain_node,
)
from agent.ray.ports import (
    LISTEN_PORTS_FROM,
    RAY_WORKER_PORTS,
    WORKER_PORT_WINDOW,
    WORKER_PORTS_FROM,
    ephemeral_port_range,
    free_port,
    port_in_use,
    worker_port_window,
)
from agent.ray.process_runtime import (
    MAX_UNIX_PATH,
    SOCKET_SUFFIX,
    HeadInfo,
    RayNodeProcess,
    RayProcessRuntime,
    RayRuntimeError,
    session_pids,
)
from agent.ray.start_args import RAY_ENV, Role, ray_start_args
from agent.ray.versions import AGENT_PORTS, agent_ports_need_pinning, labels_need_json

__all__ = [
    "AGENT_PORTS",
    "DEFAULT_PORTS",
    "DRAIN_REASONS",
    "HEAD_RESOURCE",
    "LISTEN_PORTS_FROM",
    "MAX_UNIX_PATH",
    "NODE_LABEL",
    "RAY_ENV",
    "RAY_WORKER_PORTS",
    "SOCKET_SUFFIX",
    "WORKER_PORTS_FROM",
    "WORKER_PORT_WINDOW",
    "HeadInfo",
    "PendingDemand",
    "RayClusterStatus",
    "RayNodeProcess",
    "RayNodeStatus",
    "RayProcessRuntime",
    "RayRuntimeError",
    "Role",
    "agent_ports_need_pinning",
    "cluster_status",
    "docker_run_spec",
    "drain_node",
    "ephemeral_port_range",
    "free_port",
    "labels_need_json",
    "port_in_use",
    "ray_start_args",
    "session_pids",
    "worker_port_window",
]
