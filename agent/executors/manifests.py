"""Kubernetes manifests for one workload, shared by the kubernetes and argocd executors.

A ``container.create`` becomes a Deployment (one replica; zero when stopped), a ClusterIP Service for
its first port and, when ``endpoint_host`` is set, an Ingress routing that host to the Service. All
three live in `NAMESPACE`, carry ``app.kubernetes.io/managed-by=cleverthis`` and the label
``cleverthis.io/workload-id=<id>``.

The container id in these modes is `workload_id(command_key)`: ``ct-`` plus the first 16 hex digits of
the SHA-256 of the create command's idempotency key. It is stable (the same key always yields the same
id, on any node and after restarts), fits in a label value, and the key itself is kept in the
``cleverthis.io/command-key`` annotation.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

import yaml

from agent.protocol import ContainerCreatePayload

NAMESPACE = "cleverthis-workloads"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "cleverthis"
WORKLOAD_LABEL = "cleverthis.io/workload-id"
NAME_LABEL = "app.kubernetes.io/name"
COMMAND_KEY_ANNOTATION = "cleverthis.io/command-key"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def workload_id(command_key: str) -> str:
    """The stable container id of the workload created by the command with this idempotency key."""
    return "ct-" + hashlib.sha256(command_key.encode()).hexdigest()[:16]


def resource_name(name: str) -> str:
    """`name` as a DNS-1123 label (lower case, alphanumerics and '-', at most 63 characters)."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    cleaned = re.sub(r"-{2,}", "-", cleaned)[:63].rstrip("-")
    if not cleaned:
        raise ValueError(f"{name!r} cannot be turned into a Kubernetes name")
    return cleaned


def _labels(payload: ContainerCreatePayload, wid: str, name: str) -> dict[str, str]:
    user = {k: v for k, v in payload.labels.items() if _LABEL_VALUE.match(v) and len(v) <= 63}
    return {**user, MANAGED_BY_LABEL: MANAGED_BY, WORKLOAD_LABEL: wid, NAME_LABEL: name}


def registry_host(image: str) -> str:
    """The registry an image reference points at (Docker Hub for bare names), as Docker config keys it."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return first
    return "https://index.docker.io/v1/"


def pull_secret_name(name: str) -> str:
    """Name of the imagePullSecret holding a workload's registry credentials."""
    return resource_name(name)[:54].rstrip("-") + "-registry"


def pull_secret(payload: ContainerCreatePayload, *, command_key: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """A ``kubernetes.io/dockerconfigjson`` Secret with the payload's registry credentials."""
    user, password = payload.registry_username, payload.registry_password
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    config = {"auths": {registry_host(payload.image): {"username": user, "password": password, "auth": auth}}}
    wid = workload_id(command_key)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/dockerconfigjson",
        "metadata": {
            "name": pull_secret_name(payload.name),
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, WORKLOAD_LABEL: wid},
        },
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()},
    }


def build_manifests(
    payload: ContainerCreatePayload,
    *,
    command_key: str,
    namespace: str = NAMESPACE,
    replicas: int | None = None,
    pull_secret_ref: str = "",
) -> list[dict[str, Any]]:
    """Deployment, then Service (if any port), then Ingress (if `endpoint_host` and a port).

    `pull_secret_ref` names an imagePullSecret for the pod (see `pull_secret`); the Secret itself is not
    among the returned manifests (argocd mode must not commit credentials to Git).
    """
    wid = workload_id(command_key)
    name = resource_name(payload.name)
    labels = _labels(payload, wid, name)
    annotations = {COMMAND_KEY_ANNOTATION: command_key}
    meta = {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations}

    container: dict[str, Any] = {"name": name, "image": payload.image}
    if payload.command:
        container["args"] = list(payload.command)  # like `docker run IMAGE CMD...`: keeps the entrypoint
    if payload.env:
        container["env"] = [{"name": k, "value": v} for k, v in sorted(payload.env.items())]
    if payload.ports:
        container["ports"] = [
            {"containerPort": p.container_port, "protocol": p.protocol.upper()} for p in payload.ports
        ]
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if payload.cpu > 0:
        requests["cpu"] = limits["cpu"] = f"{round(payload.cpu * 1000)}m"
    if payload.memory_mb > 0:
        requests["memory"] = limits["memory"] = f"{payload.memory_mb}Mi"
    if payload.gpus > 0:
        limits["nvidia.com/gpu"] = str(payload.gpus)
    if requests or limits:
        container["resources"] = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}

    wanted = replicas if replicas is not None else (1 if payload.start else 0)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": wanted,
            "selector": {"matchLabels": {WORKLOAD_LABEL: wid}},
            "template": {
                "metadata": {"labels": {MANAGED_BY_LABEL: MANAGED_BY, WORKLOAD_LABEL: wid, NAME_LABEL: name}},
                "spec": {
                    "containers": [container],
                    **({"imagePullSecrets": [{"name": pull_secret_ref}]} if pull_secret_ref else {}),
                },
            },
        },
    }
    manifests = [deployment]
    if payload.ports:
        first = payload.ports[0]
        manifests.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": dict(meta),
                "spec": {
                    "type": "ClusterIP",
                    "selector": {WORKLOAD_LABEL: wid},
                    "ports": [
                        {
                            "name": "main",
                            "port": first.container_port,
                            "targetPort": first.container_port,
                            "protocol": first.protocol.upper(),
                        }
                    ],
                },
            }
        )
        if payload.endpoint_host:
            manifests.append(
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "Ingress",
                    "metadata": dict(meta),
                    "spec": {
                        "rules": [
                            {
                                "host": payload.endpoint_host,
                                "http": {
                                    "paths": [
                                        {
                                            "path": "/",
                                            "pathType": "Prefix",
                                            "backend": {
                                                "service": {"name": name, "port": {"number": first.container_port}}
                                            },
                                        }
                                    ]
                                },
                            }
                        ]
                    },
                }
            )
    return manifests


def scaled(manifests: list[dict[str, Any]], replicas: int) -> list[dict[str, Any]]:
    """A copy of `manifests` with the Deployment's replicas set."""
    out = []
    for manifest in manifests:
        if manifest.get("kind") == "Deployment":
            manifest = {**manifest, "spec": {**manifest["spec"], "replicas": replicas}}
        out.append(manifest)
    return out


def to_yaml(manifests: list[dict[str, Any]]) -> str:
    """Multi-document YAML for `manifests`."""
    return yaml.safe_dump_all(manifests, sort_keys=False, explicit_start=True)


def from_yaml(text: str) -> list[dict[str, Any]]:
    """The manifests of a multi-document YAML text."""
    return [doc for doc in yaml.safe_load_all(text) if doc]
