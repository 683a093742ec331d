"""What `ctfleet get` / `describe` know about each resource: its API path, the names it answers to, how a
row is found by name, and its table columns (`-o wide` adds more). Plain data: imports nothing heavy."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


@dataclass(frozen=True)
class Resource:
    """One kind of thing `get` lists: `path` of its API list, `model` its generated class in ctfleet.models."""

    name: str
    path: str
    model: str
    columns: tuple[str, ...]
    wide: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    name_field: str = "name"
    filters: tuple[str, ...] = ()  # query parameters the API list takes
    paged: bool = True
    notes: dict[str, Any] = field(default_factory=dict)


RESOURCES: tuple[Resource, ...] = (
    Resource(
        "workspaces",
        "api/v1/workspaces/",
        "Workspace",
        ("name", "slug", "role", "id"),
        ("created_at",),
        ("workspace", "ws"),
    ),
    Resource(
        "clusters",
        "api/v1/clusters/",
        "Cluster",
        ("name", "mode", "node_count", "id"),
        ("workspace", "git_repo_url", "created_at"),
        ("cluster",),
        filters=("workspace", "q"),
    ),
    Resource(
        "nodes",
        "api/v1/nodes/",
        "Node",
        ("name", "status", "connected", "cpu_percent", "memory_percent", "gpu_count", "id"),
        ("hostname", "cluster", "agent_version", "last_seen", "os", "arch"),
        ("node", "no"),
        filters=("cluster", "status", "q"),
    ),
    Resource(
        "commands",
        "api/v1/commands/",
        "Command",
        ("id", "command_type", "node_name", "status", "created_at"),
        ("batch_id", "created_by", "finished_at", "error_code"),
        ("command", "cmd"),
        name_field="id",
        filters=("cluster", "node", "status", "command_type"),
    ),
    Resource(
        "containers",
        "api/v1/containers/",
        "Container",
        ("name", "image", "status", "node", "id"),
        ("created_at",),
        ("container",),
        filters=("node", "status"),
    ),
    Resource(
        "endpoints",
        "api/v1/endpoints/",
        "Endpoint",
        ("slug", "model_id", "status", "node_name", "id"),
        ("revision", "min_replicas", "max_replicas", "url"),
        ("endpoint", "ep"),
        name_field="slug",
        filters=("cluster", "status"),
    ),
    Resource(
        "rayclusters",
        "api/v1/ray/clusters/",
        "RayCluster",
        ("name", "status", "runtime", "ray_version", "compute_cluster_name", "id"),
        ("head_node_name", "min_workers", "max_workers", "dashboard_url"),
        ("raycluster", "ray-clusters", "ray-cluster", "rc"),
    ),
    Resource(
        "trainingjobs",
        "api/v1/ray/training-jobs/",
        "TrainingJob",
        ("name", "status", "id"),
        ("ray_cluster", "created_at"),
        ("trainingjob", "training-jobs", "training-job", "tj"),
    ),
    Resource(
        "tuneexperiments",
        "api/v1/ray/tune-experiments/",
        "TuneExperiment",
        ("name", "status", "id"),
        ("ray_cluster", "created_at"),
        ("tuneexperiment", "tune-experiments", "tune-experiment", "tune"),
    ),
    Resource(
        "servedeployments",
        "api/v1/ray/deployments/",
        "ServeDeployment",
        ("name", "status", "id"),
        ("ray_cluster", "created_at"),
        ("servedeployment", "serve-deployments", "serve-deployment", "deployments", "serve"),
    ),
    Resource(
        "apikeys",
        "api/v1/api-keys/",
        "ApiKey",
        ("name", "key_prefix", "scopes", "revoked_at", "id"),
        ("workspace", "expires_at", "last_used_at", "created_at"),
        ("apikey", "api-keys", "api-key", "keys", "key"),
    ),
    Resource(
        "quotas",
        "api/v1/workspaces/{workspace}/quotas/",
        "Quotas",
        ("workspace", "quota", "limit", "in_use", "percent"),
        ("label", "unit"),
        ("quota",),
        name_field="quota",
        paged=False,
    ),
    Resource(
        "usage",
        "api/v1/usage/",
        "Usage",
        ("subject_kind", "name", "requests", "errors", "prompt_tokens", "completion_tokens"),
        ("api_key_name", "latency_ms_mean", "node_hours", "gpu_hours"),
        name_field="name",
        paged=False,
        filters=("period", "workspace", "endpoint", "api_key"),
    ),
)

_BY_NAME: dict[str, Resource] = {}
for _r in RESOURCES:
    for _n in (_r.name, *_r.aliases):
        _BY_NAME[_n] = _r


def resource(name: str) -> Resource | None:
    """The resource `name` (or one of its aliases, case and dashes ignored) stands for."""
    key = name.lower()
    return _BY_NAME.get(key) or _BY_NAME.get(key.replace("-", "")) or _BY_NAME.get(key.rstrip("s"))


def names() -> list[str]:
    return [r.name for r in RESOURCES]


def is_uuid(value: str) -> bool:
    return bool(UUID_RE.match(value))
