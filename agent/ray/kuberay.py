"""Ray on Kubernetes through KubeRay: a managed Ray cluster is one ``RayCluster`` (ray.io/v1) resource.

`agent.ray.raycluster.raycluster_manifest` renders it from a ``ray.head.start`` payload: a head group and
one worker group ("workers", min/max replicas and resources from the payload) with KubeRay's in-tree autoscaler on
(``idleTimeoutSeconds`` from the payload, 60 s by default), so Ray scales its worker group itself.
Every object carries the labels of the project's other Kubernetes workloads
(``app.kubernetes.io/managed-by=cleverthis``, ``app.kubernetes.io/name``) plus
``cleverthis.io/ray-cluster=<control-plane cluster id>``, by which the agent finds it again.

Two backends apply it:

- `KubeRayKube` (kubernetes mode) through the kubernetes executor's API client: create, or resume a
  suspended one; stop sets ``spec.suspend: true`` (KubeRay deletes the pods and keeps the resource:
  "no compute allocated, state preserved" as a stopped cluster promises, and start is one field
  flipped back, with the same name and head Service, and the spec rendered anew so settings changed
  while stopped apply); delete deletes it. Status is the resource's
  ``status`` plus the head's Ray state API (``/api/v0/nodes``) through the head's Service.
- `KubeRayGitOps` (argocd mode) commits the same manifest as ``manifests/raycluster-<name>.yaml``
  through the argocd executor (same locking, push retry and commit message format), then syncs;
  stop commits ``suspend: true``, delete commits the file's removal.

Without the RayCluster CRD the API answers 404 on ``/apis/ray.io/v1``; that becomes `kuberay_missing`
with the operator's install link, never the API's 404 text.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from agent import protocol
from agent.errors import CommandFailed
from agent.executors import manifests as mf
from agent.executors.base import ProgressFn
from agent.ray.raycluster import (
    CLUSTER_LABEL,
    GROUP,
    INSTALL_URL,
    KIND,
    MANIFEST_PREFIX,
    MEMBER_ANNOTATION,
    MISSING_MESSAGE,
    PLURAL,
    SERVE_PORT,
    VERSION,
    dashboard_port,
    facts,
    head_host,
    head_service_host,
    ray_nodes,
    raycluster_manifest,
    status_result,
)


class KubeRayKube:
    """RayClusters through the kube API, with the kubernetes executor's client and namespace."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self.namespace: str = executor.namespace
        self._crd_seen = False
        self._lock = threading.Lock()
        self._hosts: set[tuple[str, int]] = set()
        self._hosts_at = 0.0

    def _custom(self) -> Any:
        import kubernetes

        return kubernetes.client.CustomObjectsApi(self.executor._client())

    def _errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        from agent.executors.kubernetes import _api_errors

        return _api_errors(what)

    def _require_crd(self) -> None:
        """`kuberay_missing` unless the API serves ray.io/v1 (cached once seen)."""
        if self._crd_seen:
            return
        from kubernetes.client.rest import ApiException

        try:
            self._custom().get_api_resources(GROUP, VERSION)
        except ApiException as exc:
            if exc.status == 404:
                raise CommandFailed("kuberay_missing", MISSING_MESSAGE, install_url=INSTALL_URL) from None
            raise
        self._crd_seen = True

    def _find(self, cluster_id: str) -> dict[str, Any] | None:
        found = self._custom().list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, label_selector=f"{CLUSTER_LABEL}={cluster_id}"
        )
        items = found.get("items") or []
        return items[0] if items else None

    def apply(self, p: protocol.RayHeadStartPayload, progress: ProgressFn) -> protocol.RayNodeStartResult:
        """Create the RayCluster, or resume this cluster's suspended one (same name, same Service)."""
        from kubernetes.client.rest import ApiException

        manifest = raycluster_manifest(p, namespace=self.namespace)
        name = manifest["metadata"]["name"]
        self._hosts_at = 0.0  # the proxy targets change with this cluster
        with self._errors("ray.head.start"), self._lock:
            self.executor._ensure_namespace()
            self._require_crd()
            api = self._custom()
            existing = self._find(p.cluster_id)
            if existing is not None:
                # The spec as rendered now: settings changed while it was stopped (bounds, version) apply.
                patch = {"metadata": {"annotations": {MEMBER_ANNOTATION: p.member_id}}, "spec": manifest["spec"]}
                resumed = bool((existing.get("spec") or {}).get("suspend"))
                obj = api.patch_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, existing["metadata"]["name"], patch
                )
                progress(f"{'resumed' if resumed else 'found'} RayCluster {self.namespace}/{obj['metadata']['name']}")
                return facts(obj, self.namespace, existed=True, resumed=resumed)
            try:
                obj = api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, manifest)
            except ApiException as exc:
                if exc.status == 409:
                    raise CommandFailed(
                        "conflict", f"a RayCluster named {name!r} already exists in {self.namespace}"
                    ) from None
                raise CommandFailed(
                    "internal", f"creating RayCluster {name} failed: {exc.status} {_reason(exc)}"
                ) from None
            progress(
                f"created RayCluster {self.namespace}/{name} "
                f"(Ray {p.ray_version}, {p.min_workers}-{p.max_workers} workers)"
            )
            return facts(obj, self.namespace, existed=False, resumed=False)

    def suspend(self, cluster_id: str, progress: ProgressFn) -> protocol.RayNodeStopResult:
        """``spec.suspend: true``: KubeRay deletes the pods, the resource stays for a later start."""
        with self._errors("ray.node.stop"):
            self._require_crd()
            existing = self._find(cluster_id)
            if existing is None:
                return protocol.RayNodeStopResult(stopped=False, reason="no RayCluster for this Ray cluster")
            name = existing["metadata"]["name"]
            self._custom().patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, {"spec": {"suspend": True}}
            )
            progress(f"suspended RayCluster {self.namespace}/{name}")
            return protocol.RayNodeStopResult(stopped=True, suspended=True, container_id=name)

    def delete(self, cluster_id: str, progress: ProgressFn) -> protocol.RayNodeStopResult:
        """Delete the RayCluster (KubeRay removes its pods and Services); already gone is fine."""
        from kubernetes.client.rest import ApiException

        with self._errors("ray.node.stop"):
            self._require_crd()
            existing = self._find(cluster_id)
            if existing is None:
                return protocol.RayNodeStopResult(stopped=False, reason="no RayCluster for this Ray cluster")
            name = existing["metadata"]["name"]
            try:
                self._custom().delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
            progress(f"deleted RayCluster {self.namespace}/{name}")
            return protocol.RayNodeStopResult(stopped=True, deleted=True, container_id=name)

    def status(self, p: protocol.RayStatusPayload) -> protocol.RayStatusResult:
        """The resource's status plus the Ray nodes the head reports (its API error, if it does not answer)."""
        with self._errors("ray.status"):
            self._require_crd()
            obj = self._find(p.cluster_id)
        if obj is None:
            raise CommandFailed("not_found", f"no RayCluster for Ray cluster {p.cluster_id} in {self.namespace}")
        if (obj.get("spec") or {}).get("suspend"):
            return status_result(obj, [], self.namespace)
        member = ((obj["metadata"].get("annotations") or {}).get(MEMBER_ANNOTATION)) or p.member_id
        try:
            nodes = ray_nodes(head_host(obj, self.namespace), dashboard_port(obj), member)
        except CommandFailed as exc:
            return status_result(obj, [], self.namespace, error=exc.message)
        return status_result(obj, nodes, self.namespace)

    def proxy_targets(self) -> set[tuple[str, int]]:
        """(host, port) of every managed head's Service: dashboard and Serve (cached for 5 s)."""
        if time.monotonic() - self._hosts_at < 5.0:
            return set(self._hosts)
        targets: set[tuple[str, int]] = set()
        try:
            found = self._custom().list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, label_selector=f"{mf.MANAGED_BY_LABEL}={mf.MANAGED_BY}"
            )
        except Exception:  # no CRD, no API: nothing to reach
            found = {}
        for obj in found.get("items") or []:
            for host in {head_host(obj, self.namespace), head_service_host(obj["metadata"]["name"], self.namespace)}:
                targets |= {(host, dashboard_port(obj)), (host, SERVE_PORT)}
        self._hosts, self._hosts_at = targets, time.monotonic()
        return set(targets)


class KubeRayGitOps:
    """RayClusters as manifests committed through the argocd executor, then an ArgoCD sync."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self.namespace: str = executor.namespace

    def _path(self, repo: Any, name: str) -> Path:
        from agent.executors.argocd import MANIFEST_DIR

        return Path(repo.working_tree_dir) / MANIFEST_DIR / f"{MANIFEST_PREFIX}{name}.yaml"

    def _find(self, repo: Any, cluster_id: str) -> tuple[Path, dict[str, Any]] | None:
        from agent.executors.argocd import MANIFEST_DIR

        folder = Path(repo.working_tree_dir) / MANIFEST_DIR
        for path in sorted(folder.glob(f"{MANIFEST_PREFIX}*.yaml")):
            with contextlib.suppress(ValueError):
                for obj in mf.from_yaml(path.read_text()):
                    if (
                        obj.get("kind") == KIND
                        and (obj["metadata"].get("labels") or {}).get(CLUSTER_LABEL) == cluster_id
                    ):
                        return path, obj
        return None

    def _write(self, path: Path, obj: dict[str, Any]) -> None:
        path.parent.mkdir(exist_ok=True)
        path.write_text(mf.to_yaml([obj]))

    def apply(self, p: protocol.RayHeadStartPayload, progress: ProgressFn) -> protocol.RayNodeStartResult:
        """Commit ``manifests/raycluster-<name>.yaml`` (or un-suspend it), then sync."""
        manifest = raycluster_manifest(p, namespace=self.namespace)
        name = manifest["metadata"]["name"]
        outcome: dict[str, Any] = {"existed": False, "resumed": False}

        def change(repo: Any) -> bool:
            found = self._find(repo, p.cluster_id)
            if found is not None:
                path, obj = found
                outcome.update(existed=True, resumed=bool(obj["spec"].get("suspend")))
                obj = {**manifest, "metadata": {**manifest["metadata"], "name": obj["metadata"]["name"]}}
                outcome["obj"] = obj
                if path.read_text() == mf.to_yaml([obj]):
                    return False
                self._write(path, obj)
                return True
            path = self._path(repo, name)
            if path.exists():
                raise CommandFailed("conflict", f"{path.parent.name}/{path.name} already describes another Ray cluster")
            outcome["obj"] = manifest
            self._write(path, manifest)
            return True

        verb = lambda: "start" if outcome["existed"] else "deploy"  # noqa: E731
        commit = self.executor._commit(
            change, lambda: f"cleverthis: {verb()} ray cluster {name} ({p.cluster_id})", progress
        )
        self.executor._sync(progress)
        return facts(
            outcome["obj"], self.namespace, existed=outcome["existed"], resumed=outcome["resumed"], commit=commit
        )

    def _edit(self, cluster_id: str, verb: str, progress: ProgressFn, *, remove: bool) -> protocol.RayNodeStopResult:
        found_name: dict[str, str] = {}

        def change(repo: Any) -> bool:
            found = self._find(repo, cluster_id)
            if found is None:
                return False
            path, obj = found
            found_name["name"] = obj["metadata"]["name"]
            if remove:
                path.unlink()
                return True
            if obj["spec"].get("suspend"):
                return False
            obj["spec"]["suspend"] = True
            self._write(path, obj)
            return True

        commit = self.executor._commit(
            change, lambda: f"cleverthis: {verb} ray cluster {found_name['name']} ({cluster_id})", progress
        )
        if "name" not in found_name:
            return protocol.RayNodeStopResult(stopped=False, reason="no RayCluster manifest for this Ray cluster")
        self.executor._sync(progress)
        return protocol.RayNodeStopResult(
            stopped=True,
            container_id=found_name["name"],
            commit=commit,
            deleted=True if remove else None,
            suspended=None if remove else True,
        )

    def suspend(self, cluster_id: str, progress: ProgressFn) -> protocol.RayNodeStopResult:
        """Commit ``suspend: true`` and sync."""
        return self._edit(cluster_id, "stop", progress, remove=False)

    def delete(self, cluster_id: str, progress: ProgressFn) -> protocol.RayNodeStopResult:
        """Commit the manifest's removal and sync (ArgoCD prunes the RayCluster)."""
        return self._edit(cluster_id, "destroy", progress, remove=True)

    def status(self, p: protocol.RayStatusPayload) -> protocol.RayStatusResult:
        """The committed (desired) state plus the Ray nodes the head's Service reports."""
        with self.executor._locked() as repo:
            found = self._find(repo, p.cluster_id)
        if found is None:
            raise CommandFailed("not_found", f"no RayCluster manifest for Ray cluster {p.cluster_id}")
        obj = found[1]
        if obj["spec"].get("suspend"):
            return status_result(obj, [], self.namespace)
        obj = {**obj, "status": {"state": "committed"}}
        try:
            nodes = ray_nodes(head_host(obj, self.namespace), dashboard_port(obj), p.member_id)
        except CommandFailed as exc:
            return status_result(obj, [], self.namespace, error=exc.message)
        return status_result(obj, nodes, self.namespace)

    def proxy_targets(self) -> set[tuple[str, int]]:
        """(host, port) of the heads' Services in the committed manifests."""
        from agent.executors.argocd import MANIFEST_DIR

        targets: set[tuple[str, int]] = set()
        repo = self.executor._repo
        if repo is None:
            return targets
        for path in (Path(repo.working_tree_dir) / MANIFEST_DIR).glob(f"{MANIFEST_PREFIX}*.yaml"):
            with contextlib.suppress(ValueError, OSError, KeyError):
                for obj in mf.from_yaml(path.read_text()):
                    host = head_service_host(obj["metadata"]["name"], self.namespace)
                    targets |= {(host, dashboard_port(obj)), (host, SERVE_PORT)}
        return targets


def _reason(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def backend_for(executor: Any) -> KubeRayKube | KubeRayGitOps | None:
    """The KubeRay backend for the cluster's executor (None in standalone mode)."""
    mode = getattr(executor, "mode", "")
    if mode == "kubernetes":
        return KubeRayKube(executor)
    if mode == "argocd":
        return KubeRayGitOps(executor)
    return None
