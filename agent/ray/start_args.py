"""The ``ray start`` command line of one Ray node, and Ray's own settings for every node the agent starts."""

from __future__ import annotations

import json
from typing import Literal

Role = Literal["head", "worker"]

# Ray's own settings for every node this agent starts. Serve gives a new HTTP proxy 5 s to answer its first
# ready check, then kills it; on a busy machine starting the proxy's worker and importing its web stack
# takes longer, and Ray 2.9's `serve.start` then fails ("The actor died unexpectedly"). Within the 60 s
# `serve.start` itself waits for the proxies.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "45"}


def _fmt_resources(resources: dict[str, float]) -> str:
    return json.dumps(resources, sort_keys=True)


def ray_start_args(
    *,
    role: Role,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    resources: dict[str, float] | None = None,
    labels: dict[str, str] | None = None,
    gcs_port: int | None = None,
    head_address: str | None = None,
    dashboard_port: int | None = None,
    dashboard_host: str = "127.0.0.1",
    client_server_port: int | None = None,
    dashboard_agent_listen_port: int | None = None,
    node_ip_address: str | None = None,
    temp_dir: str | None = None,
    labels_as_json: bool = False,
    dashboard_agent_grpc_port: int | None = None,
    runtime_env_agent_port: int | None = None,
    metrics_export_port: int | None = None,
    worker_ports: tuple[int, int] | None = None,
) -> list[str]:
    """The ``ray start --block`` arguments (after ``ray``) for a head or a worker.

    `labels_as_json`: Ray before 2.45 reads ``--labels`` as a JSON object, later ones as ``k=v,k=v``.
    The agent ports (`dashboard_agent_grpc_port`, `runtime_env_agent_port`, `metrics_export_port`) are
    passed when given (see `agent_ports_need_pinning`); `worker_ports` is this node's ``(min, max)`` worker
    port range (see `worker_port_window`).
    """
    args = ["start", "--block", "--disable-usage-stats"]
    if role == "head":
        if not gcs_port:
            raise ValueError("a head needs an explicit gcs_port (Ray's default 6379 is Redis's)")
        args += ["--head", f"--port={gcs_port}", f"--dashboard-host={dashboard_host}"]
        if dashboard_port:
            args.append(f"--dashboard-port={dashboard_port}")
        if client_server_port:
            args.append(f"--ray-client-server-port={client_server_port}")
    else:
        if not head_address:
            raise ValueError("a worker needs the head's address")
        args.append(f"--address={head_address}")
    if num_cpus is not None:
        args.append(f"--num-cpus={num_cpus:g}")
    if num_gpus is not None:
        args.append(f"--num-gpus={num_gpus:g}")
    if resources:
        args.append(f"--resources={_fmt_resources(resources)}")
    if labels:
        if labels_as_json:
            args.append("--labels=" + json.dumps(dict(sorted(labels.items())), separators=(",", ":")))
        else:
            args.append("--labels=" + ",".join(f"{key}={value}" for key, value in sorted(labels.items())))
    if dashboard_agent_listen_port:
        args.append(f"--dashboard-agent-listen-port={dashboard_agent_listen_port}")
    if dashboard_agent_grpc_port:
        args.append(f"--dashboard-agent-grpc-port={dashboard_agent_grpc_port}")
    if runtime_env_agent_port:
        args.append(f"--runtime-env-agent-port={runtime_env_agent_port}")
    if metrics_export_port:
        args.append(f"--metrics-export-port={metrics_export_port}")
    if worker_ports:
        args += [f"--min-worker-port={worker_ports[0]}", f"--max-worker-port={worker_ports[1]}"]
    if node_ip_address:
        args.append(f"--node-ip-address={node_ip_address}")
    if temp_dir:
        args.append(f"--temp-dir={temp_dir}")
    return args
