"""The RayCluster resource (ray.io/v1) of a managed Ray cluster on Kubernetes, whichever backend applies it
(`agent.ray.kuberay`): `raycluster_manifest` renders it from a ``ray.head.start`` payload (a head group and
one "workers" group with KubeRay's in-tree autoscaler on), and the facts and ``ray.status`` result read back
from it and from the head's Ray state API (``/api/v0/nodes``) through the head's Service.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from agent import protocol
from agent.errors import CommandFailed
from agent.executors import manifests as mf

GROUP = "ray.io"
VERSION = "v1"
PLURAL = "rayclusters"
KIND = "RayCluster"
CLUSTER_LABEL = "cleverthis.io/ray-cluster"
MEMBER_ANNOTATION = "cleverthis.io/ray-member"
WORKER_GROUP = "workers"
CLIENT_PORT = 10001
SERVE_PORT = 8000
HEAD_CPU = "1"
HEAD_MEMORY = "4Gi"
INSTALL_URL = "https://docs.ray.io/en/latest/cluster/kubernetes/getting-started/kuberay-operator-installation.html"
MISSING_MESSAGE = (
    "The KubeRay operator is not installed in this Kubernetes cluster (it has no ray.io/v1 RayCluster "
    f"resource): install the KubeRay operator ({INSTALL_URL}), then start the Ray cluster again."
)
MANIFEST_PREFIX = "raycluster-"


def head_service_host(name: str, namespace: str = mf.NAMESPACE) -> str:
    """The in-cluster DNS name of the head Service KubeRay creates for RayCluster `name`."""
    return f"{name}-head-svc.{namespace}.svc"


def _quantity_cpu(cpus: float) -> str:
    return f"{round(cpus * 1000)}m"


def raycluster_manifest(
    p: protocol.RayHeadStartPayload, *, namespace: str = mf.NAMESPACE, suspend: bool = False
) -> dict[str, Any]:
    """The RayCluster for a ``ray.head.start`` payload of runtime ``kuberay`` (``ValueError`` if unusable)."""
    name = mf.resource_name(p.name or f"ray-{p.cluster_id}")
    if len(name) > 50:  # KubeRay derives pod and Service names from it
        raise ValueError(f"RayCluster name {name!r} is longer than 50 characters")
    if p.max_workers < p.min_workers:
        raise ValueError("max_workers must be at least min_workers")
    labels = {mf.MANAGED_BY_LABEL: mf.MANAGED_BY, mf.NAME_LABEL: name, CLUSTER_LABEL: p.cluster_id}
    head_ports = [
        {"name": "gcs-server", "containerPort": p.gcs_port},
        {"name": "dashboard", "containerPort": p.dashboard_port},
        {"name": "client", "containerPort": CLIENT_PORT},
        {"name": "serve", "containerPort": SERVE_PORT},
    ]
    head_resources = {"cpu": HEAD_CPU, "memory": HEAD_MEMORY}
    worker_requests: dict[str, str] = {}
    if p.worker_cpus > 0:
        worker_requests["cpu"] = _quantity_cpu(p.worker_cpus)
    if p.worker_memory_mb > 0:
        worker_requests["memory"] = f"{p.worker_memory_mb}Mi"
    worker_limits = dict(worker_requests)
    if p.worker_gpus > 0:
        worker_limits["nvidia.com/gpu"] = str(p.worker_gpus)
    worker_container: dict[str, Any] = {
        "name": "ray-worker",
        "image": p.worker_image or p.image,
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
    }
    if worker_requests or worker_limits:
        worker_container["resources"] = {
            k: v for k, v in (("requests", worker_requests), ("limits", worker_limits)) if v
        }
    worker_params = {"num-gpus": str(p.worker_gpus)} if p.worker_gpus else {}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {MEMBER_ANNOTATION: p.member_id},
        },
        "spec": {
            "rayVersion": p.ray_version,
            "suspend": suspend,
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": {"idleTimeoutSeconds": p.idle_timeout_s, "upscalingMode": "Default"},
            "headGroupSpec": {
                "serviceType": "ClusterIP",
                "rayStartParams": {
                    "dashboard-host": "0.0.0.0",
                    "port": str(p.gcs_port),
                    "dashboard-port": str(p.dashboard_port),
                },
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {
                        "containers": [
                            {
                                "name": "ray-head",
                                "image": p.image,
                                "ports": head_ports,
                                "resources": {"requests": dict(head_resources), "limits": dict(head_resources)},
                            }
                        ]
                    },
                },
            },
            "workerGroupSpecs": [
                {
                    "groupName": WORKER_GROUP,
                    "replicas": p.min_workers,
                    "minReplicas": p.min_workers,
                    "maxReplicas": p.max_workers,
                    "rayStartParams": worker_params,
                    "template": {
                        "metadata": {"labels": dict(labels)},
                        "spec": {"containers": [worker_container]},
                    },
                }
            ],
        },
    }


def dashboard_port(obj: dict[str, Any]) -> int:
    params = obj.get("spec", {}).get("headGroupSpec", {}).get("rayStartParams", {}) or {}
    value = str(params.get("dashboard-port", "8265"))
    return int(value) if value.isdigit() else 8265


def head_host(obj: dict[str, Any], namespace: str = mf.NAMESPACE) -> str:
    """Where the head's Service answers: the Service IP KubeRay reports, else its DNS name."""
    head = (obj.get("status") or {}).get("head") or {}
    return str(head.get("serviceIP") or head_service_host(obj["metadata"]["name"], namespace))


def facts(obj: dict[str, Any], namespace: str = mf.NAMESPACE, **extra: Any) -> protocol.RayNodeStartResult:
    """The `ray.head.start` result for a RayCluster (`extra`: its other result fields)."""
    return protocol.RayNodeStartResult(
        container_id=obj["metadata"]["name"],
        hostname=head_host(obj, namespace),
        dashboard_port=dashboard_port(obj),
        **extra,
    )


def ray_nodes(host: str, port: int, head_member: str, *, timeout_s: float = 10.0) -> list[protocol.RayStatusNode]:
    """The live Ray nodes from the head's state API, as `ray.status` result nodes."""
    url = f"http://{host}:{port}/api/v0/nodes?limit=1000&detail=true"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = json.loads(response.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise CommandFailed("not_found", f"the Ray head at {host}:{port} does not answer: {exc}") from None
    rows = ((body.get("data") or {}).get("result") or {}).get("result") or []
    nodes = []
    for row in rows:
        if not isinstance(row, dict) or row.get("state") != "ALIVE":
            continue
        head = bool(row.get("is_head_node"))
        nodes.append(
            protocol.RayStatusNode(
                ray_node_id=str(row.get("node_id", "")),
                member_id=head_member if head else "",
                is_head=head,
                status="RUNNING",
                resources=row.get("resources_total") or {},
                ip=str(row.get("node_ip", "")),
                name=str(row.get("node_name", "")),
            )
        )
    return nodes


def status_result(
    obj: dict[str, Any], nodes: list[protocol.RayStatusNode], namespace: str, *, error: str = ""
) -> protocol.RayStatusResult:
    """A `ray.status` result: the Ray nodes plus the RayCluster's own status (KubeRay's view)."""
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    groups = spec.get("workerGroupSpecs") or [{}]
    kuberay = protocol.RayKubeStatus(
        name=obj["metadata"]["name"],
        state=str(status.get("state") or ("suspended" if spec.get("suspend") else "pending")),
        suspended=bool(spec.get("suspend")),
        ready_workers=int(status.get("readyWorkerReplicas") or status.get("availableWorkerReplicas") or 0),
        desired_workers=int(status.get("desiredWorkerReplicas") or 0),
        min_workers=int(groups[0].get("minReplicas") or 0),
        max_workers=int(groups[0].get("maxReplicas") or 0),
        head_host=head_host(obj, namespace),
        ray_api_error=error or None,
    )
    return protocol.RayStatusResult(nodes=nodes, kuberay=kuberay)
