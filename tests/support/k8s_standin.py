"""A loopback stand-in for the Kubernetes API server: just the REST paths the kubernetes executor uses.

Objects live in memory. Supported: namespaces (cluster scope), and per namespace deployments
(apps/v1), services and secrets (v1), ingresses (networking.k8s.io/v1) and KubeRay's rayclusters
(ray.io/v1, plus the ``/apis/ray.io/v1`` discovery path) with list (``labelSelector`` equality
terms), create, read, replace, merge/strategic-merge or JSON patch, and delete.

Every object created, replaced or patched is validated as the API server would, answering 422 Invalid:
namespaces, deployments, services, secrets and ingresses against the official Kubernetes schemas
(`tests.support.k8s_schema`, kubernetes-validate's strict schemas: an unknown field or a wrong type
fails), RayClusters against `tests.support.raycluster_schema` (the CRD's OpenAPI validation).
With ``kuberay_installed=False`` every ray.io path answers the API's 404 for an unknown resource, as a
cluster without the CRD does. Like the KubeRay
operator, the stand-in then reports a status: ``suspended`` while ``spec.suspend``, otherwise
``ready`` with ``minReplicas`` ready workers and ``head.serviceIP`` = `ray_service_ip`. Errors are proper
``Status`` objects: 404 NotFound (also for a missing namespace on create), 409 AlreadyExists, 401 without
the bearer token. Like a real controller, a deployment's ``status.replicas``/``readyReplicas`` follow
``spec.replicas``. `write_kubeconfig` writes a kubeconfig pointing at the stand-in.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from tests.support import k8s_schema, raycluster_schema
from tests.support.loopback import LoopbackHTTPServer

# (url prefix, group, version, plural, kind)
RESOURCES = {
    "deployments": ("/apis/apps/v1", "apps", "apps/v1", "Deployment"),
    "services": ("/api/v1", "", "v1", "Service"),
    "ingresses": ("/apis/networking.k8s.io/v1", "networking.k8s.io", "networking.k8s.io/v1", "Ingress"),
    "secrets": ("/api/v1", "", "v1", "Secret"),
    "rayclusters": ("/apis/ray.io/v1", "ray.io", "ray.io/v1", "RayCluster"),
}
_NAMESPACED = re.compile(
    r"^(?P<prefix>/api/v1|/apis/apps/v1|/apis/networking\.k8s\.io/v1|/apis/ray\.io/v1)/namespaces/(?P<ns>[^/]+)/"
    r"(?P<plural>deployments|services|ingresses|secrets|rayclusters)(?:/(?P<name>[^/]+))?$"
)
_RAY_DISCOVERY = "/apis/ray.io/v1"
_NAMESPACES = re.compile(r"^/api/v1/namespaces(?:/(?P<name>[^/]+))?$")


@dataclass
class Call:
    """A request the stand-in served."""

    method: str
    path: str
    status: int


class K8sStandin(LoopbackHTTPServer):
    """Threaded HTTP server on 127.0.0.1 speaking enough of the Kubernetes API."""

    methods = ("GET", "POST", "PUT", "PATCH", "DELETE")

    def __init__(
        self, token: str = "standin-token", *, kuberay_installed: bool = True, ray_service_ip: str = ""
    ) -> None:
        self.token = token
        self.kuberay_installed = kuberay_installed
        self.ray_service_ip = ray_service_ip
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, namespace, name)
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._version = 0
        super().__init__(0)

    def handle(self, method: str, request: BaseHTTPRequestHandler) -> None:
        self._dispatch(request)

    def write_kubeconfig(self, path: Path, *, token: str | None = None) -> Path:
        """A kubeconfig whose current context points at this stand-in."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "agent", "user": {"token": token or self.token}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "agent"}}],
            "current-context": "standin",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        return path

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A stored object (a copy), or None."""
        with self._lock:
            obj = self.objects.get((plural, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def names(self, plural: str, namespace: str) -> list[str]:
        with self._lock:
            return sorted(n for p, ns, n in self.objects if p == plural and ns == namespace)

    # ---- HTTP

    def _dispatch(self, req: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(req.path)
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        if req.headers.get("Authorization") != f"Bearer {self.token}":
            self._send(req, parts.path, 401, _status(401, "Unauthorized", "Unauthorized"))
            return
        body = json.loads(raw) if raw else None
        query = parse_qs(parts.query)
        with self._lock:
            status, payload = self._route(req.command, parts.path, body, query)
        self._send(req, parts.path, status, payload)

    def _send(self, req: BaseHTTPRequestHandler, path: str, status: int, payload: Any) -> None:
        raw = json.dumps(payload).encode()
        with self._lock:
            self.calls.append(Call(req.command, path, status))
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(raw)))
        req.end_headers()
        req.wfile.write(raw)

    def _route(self, method: str, path: str, body: Any, query: dict[str, list[str]]) -> tuple[int, Any]:
        if path.startswith(_RAY_DISCOVERY) and not self.kuberay_installed:
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        if path == _RAY_DISCOVERY and method == "GET":
            verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
            resource = {
                "name": "rayclusters",
                "singularName": "raycluster",
                "namespaced": True,
                "kind": "RayCluster",
                "verbs": verbs,
            }
            return 200, {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "ray.io/v1",
                "resources": [resource],
            }
        if match := _NAMESPACES.match(path):
            return self._namespaces(method, match["name"], body)
        if match := _NAMESPACED.match(path):
            plural = match["plural"]
            if RESOURCES[plural][0] != match["prefix"]:
                return 404, _status(404, "NotFound", "the server could not find the requested resource")
            return self._namespaced(method, plural, match["ns"], match["name"], body, query)
        return 404, _status(404, "NotFound", "the server could not find the requested resource")

    def _stamp(self, obj: dict[str, Any]) -> None:
        self._version += 1
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        meta["resourceVersion"] = str(self._version)
        meta["generation"] = int(meta.get("generation", 0)) + 1
        if obj.get("kind") == "Deployment":
            replicas = int(obj.get("spec", {}).get("replicas", 1))
            obj["status"] = {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas}
            obj["status"]["observedGeneration"] = meta["generation"]
        if obj.get("kind") == "RayCluster":
            obj["status"] = self._raycluster_status(obj)

    def _raycluster_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        """What the KubeRay operator would report once it reconciled `obj`."""
        spec = obj.get("spec", {})
        if spec.get("suspend"):
            return {"state": "suspended", "readyWorkerReplicas": 0, "desiredWorkerReplicas": 0}
        group = (spec.get("workerGroupSpecs") or [{}])[0]
        workers = int(group.get("minReplicas", 0))
        head: dict[str, str] = {"podIP": "10.0.0.10"}
        if self.ray_service_ip:
            head["serviceIP"] = self.ray_service_ip
        return {
            "state": "ready",
            "readyWorkerReplicas": workers,
            "availableWorkerReplicas": workers,
            "desiredWorkerReplicas": workers,
            "head": head,
        }

    def _namespaces(self, method: str, name: str | None, body: Any) -> tuple[int, Any]:
        if name is None and method == "GET":
            return 200, {
                "kind": "NamespaceList",
                "apiVersion": "v1",
                "metadata": {},
                "items": list(self.namespaces.values()),
            }
        if name is None and method == "POST":
            if invalid := _invalid("namespaces", body):
                return invalid
            name = body["metadata"]["name"]
            if name in self.namespaces:
                return 409, _status(409, "AlreadyExists", f'namespaces "{name}" already exists', name, "namespaces")
            obj = {**body, "kind": "Namespace", "apiVersion": "v1", "status": {"phase": "Active"}}
            self._stamp(obj)
            self.namespaces[name] = obj
            return 201, obj
        if name not in self.namespaces:
            return 404, _status(404, "NotFound", f'namespaces "{name}" not found', name, "namespaces")
        if method == "GET":
            return 200, self.namespaces[name]
        if method == "DELETE":
            self.namespaces.pop(name)
            for key in [k for k in self.objects if k[1] == name]:
                self.objects.pop(key)
            return 200, _status(200, "", "", name, "namespaces", success=True)
        return 405, _status(405, "MethodNotAllowed", "method not allowed")

    def _namespaced(
        self, method: str, plural: str, ns: str, name: str | None, body: Any, query: dict[str, list[str]]
    ) -> tuple[int, Any]:
        _, group, api_version, kind = RESOURCES[plural]
        qualified = f"{plural}.{group}" if group else plural
        if ns not in self.namespaces:
            return 404, _status(404, "NotFound", f'namespaces "{ns}" not found', ns, "namespaces")
        if name is None:
            if method == "GET":
                selector = _parse_selector((query.get("labelSelector") or [""])[0])
                items = [
                    copy.deepcopy(obj)
                    for (p, n, _), obj in sorted(self.objects.items())
                    if p == plural and n == ns and _matches(obj, selector)
                ]
                meta = {"resourceVersion": str(self._version)}
                return 200, {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": items}
            if method == "POST":
                if invalid := _invalid(plural, body):
                    return invalid
                obj_name = body.get("metadata", {}).get("name", "")
                if (plural, ns, obj_name) in self.objects:
                    message = f'{qualified} "{obj_name}" already exists'
                    return 409, _status(409, "AlreadyExists", message, obj_name, plural, group)
                obj = {**copy.deepcopy(body), "kind": kind, "apiVersion": api_version}
                obj["metadata"]["namespace"] = ns
                self._stamp(obj)
                self.objects[(plural, ns, obj_name)] = obj
                return 201, obj
            return 405, _status(405, "MethodNotAllowed", "method not allowed")
        key = (plural, ns, name)
        if key not in self.objects:
            return 404, _status(404, "NotFound", f'{qualified} "{name}" not found', name, plural, group)
        obj = self.objects[key]
        if method == "GET":
            return 200, obj
        if method == "DELETE":
            self.objects.pop(key)
            if plural == "services":  # the real API answers a service DELETE with the deleted object
                return 200, obj
            return 200, _status(200, "", "", name, plural, group, success=True)
        if method == "PUT":
            if invalid := _invalid(plural, body):
                return invalid
            new = {**copy.deepcopy(body), "kind": kind, "apiVersion": api_version}
            new["metadata"] = {**obj["metadata"], **new.get("metadata", {}), "namespace": ns}
            self._stamp(new)
            self.objects[key] = new
            return 200, new
        if method == "PATCH":
            new = _json_patch(obj, body) if isinstance(body, list) else _merge(obj, body or {})
            if invalid := _invalid(plural, {k: v for k, v in new.items() if k != "status"}):
                return invalid
            self._stamp(new)
            self.objects[key] = new
            return 200, new
        return 405, _status(405, "MethodNotAllowed", "method not allowed")


def _invalid(plural: str, body: Any) -> tuple[int, Any] | None:
    """422 Invalid for an object the API server would refuse: against its official schema (strict), or
    for a RayCluster the CRD's schema."""
    if plural == "namespaces":
        group, kind, obj = "", "Namespace", {**(body or {}), "kind": "Namespace", "apiVersion": "v1"}
    else:
        _, group, api_version, kind = RESOURCES[plural]
        obj = {**(body or {}), "kind": kind, "apiVersion": api_version}
    problems = raycluster_schema.problems(body) if plural == "rayclusters" else k8s_schema.problems(obj)
    if not problems:
        return None
    name = (body or {}).get("metadata", {}).get("name", "")
    message = f'{kind}{"." + group if group else ""} "{name}" is invalid: ' + "; ".join(problems)
    return 422, _status(422, "Invalid", message, name, plural, group)


def _status(
    code: int, reason: str, message: str, name: str = "", kind: str = "", group: str = "", *, success: bool = False
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if success else "Failure",
        "code": code,
    }
    if not success:
        status.update(message=message, reason=reason)
    if name or kind:
        status["details"] = {"name": name, "group": group, "kind": kind}
    return status


def _parse_selector(selector: str) -> dict[str, str]:
    terms: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, _, value = term.partition("=")
        terms[key.rstrip("=")] = value.lstrip("=")
    return terms


def _matches(obj: dict[str, Any], selector: dict[str, str]) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch (strategic merge behaves the same for the maps the executor patches)."""
    merged = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _json_patch(target: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/replace/remove on object paths."""
    doc = copy.deepcopy(target)
    for op in ops:
        *parents, leaf = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        if op["op"] in ("add", "replace"):
            node[leaf] = op["value"]
        elif op["op"] == "remove":
            node.pop(leaf, None)
    return doc
