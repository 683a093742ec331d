"""Kubernetes mode: each workload is a Deployment (+ Service, + Ingress) applied with the official client.

Registry credentials in the payload become a ``kubernetes.io/dockerconfigjson`` Secret referenced as the
pod's imagePullSecret (deleted with the workload).

Manifests come from `agent.executors.manifests` (shared with argocd mode). The container id is the
stable `manifests.workload_id(command_key)`; a second create with the same key finds the Deployment by
its ``cleverthis.io/workload-id`` label and returns it. stop scales to 0 replicas, start back to 1,
destroy deletes the Deployment, Service and Ingress. The namespace is created on first use.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.rest import ApiException

from agent.errors import CommandFailed
from agent.executors import manifests as mf
from agent.executors.base import ProgressFn
from agent.protocol import ContainerCreatePayload, ContainerInfo, ContainerRefPayload, ContainerResult


def resolve_kubeconfig(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path | None:
    """The kubeconfig to use: $CLEVERTHIS_KUBECONFIG, else $KUBECONFIG (first entry), else ~/.kube/config.

    An explicitly configured path is returned even if missing (so the error names it); the home default
    only if it exists. None: nothing configured (in-cluster configuration is tried next).
    """
    env = os.environ if env is None else env
    explicit = env.get("CLEVERTHIS_KUBECONFIG", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    from_env = next((p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p.strip()), "")
    if from_env:
        return Path(from_env.strip()).expanduser()
    default = (home or Path.home()) / ".kube" / "config"
    return default if default.is_file() else None


@contextlib.contextmanager
def _api_errors(what: str) -> Iterator[None]:
    """Connection and authentication problems as `kubernetes_unavailable`."""
    try:
        yield
    except ApiException as exc:
        if exc.status in (401, 403):
            raise CommandFailed(
                "kubernetes_unavailable", f"{what}: the API server refused us ({exc.status} {exc.reason})"
            ) from None
        if exc.status == 0 or exc.status is None:
            raise CommandFailed("kubernetes_unavailable", f"{what}: {exc.reason}") from None
        raise
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise CommandFailed("kubernetes_unavailable", f"{what}: API server not reachable: {exc}") from None


class KubernetesExecutor:
    """Runs container commands as Deployments in `namespace` of the cluster the kubeconfig names."""

    mode = "kubernetes"

    def __init__(self, kubeconfig_path: str | None = None, *, namespace: str | None = None) -> None:
        self.kubeconfig_path = kubeconfig_path
        self.namespace = namespace or mf.NAMESPACE
        self._api: kubernetes.client.ApiClient | None = None
        self._namespace_ready = False
        self._lock = threading.Lock()

    # ---- clients

    def _client(self) -> kubernetes.client.ApiClient:
        if self._api is not None:
            return self._api
        cfg = kubernetes.client.Configuration()
        path = Path(self.kubeconfig_path) if self.kubeconfig_path else resolve_kubeconfig()
        try:
            if path is not None:
                kubernetes.config.load_kube_config(config_file=str(path), client_configuration=cfg)
            else:
                kubernetes.config.load_incluster_config(client_configuration=cfg)
        except (kubernetes.config.ConfigException, OSError, TypeError, ValueError) as exc:
            where = str(path) if path else "in-cluster configuration"
            raise CommandFailed(
                "kubernetes_unavailable", f"cannot load Kubernetes credentials ({where}): {exc}"
            ) from None
        cfg.retries = 1
        self._api = kubernetes.client.ApiClient(cfg)
        return self._api

    def _apps(self) -> kubernetes.client.AppsV1Api:
        return kubernetes.client.AppsV1Api(self._client())

    def _core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self._client())

    def _net(self) -> kubernetes.client.NetworkingV1Api:
        return kubernetes.client.NetworkingV1Api(self._client())

    def _ensure_namespace(self) -> None:
        if self._namespace_ready:
            return
        core = self._core()
        with _api_errors("creating the workload namespace"):
            try:
                core.read_namespace(self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                body = {"metadata": {"name": self.namespace, "labels": {mf.MANAGED_BY_LABEL: mf.MANAGED_BY}}}
                try:
                    core.create_namespace(body)
                except ApiException as again:
                    if again.status != 409:
                        raise
        self._namespace_ready = True

    # ---- Executor interface

    def execute(self, command_type: str, payload: Any, *, command_key: str, progress: ProgressFn) -> ContainerResult:
        """Run one container.* command; see `agent.executors.base.Executor`."""
        with _api_errors(command_type):
            if command_type == "container.create":
                return self.create(payload, command_key=command_key, progress=progress)
            if command_type == "container.start":
                return self._scale(payload, 1)
            if command_type == "container.stop":
                return self._scale(payload, 0)
            if command_type == "container.destroy":
                return self.destroy(payload)
        raise CommandFailed("unknown_command", f"the kubernetes executor does not run {command_type!r}")

    def list_containers(self) -> list[ContainerInfo]:
        """Every Deployment labelled as ours in the workload namespace."""
        with _api_errors("listing deployments"):
            try:
                found = self._apps().list_namespaced_deployment(
                    self.namespace, label_selector=f"{mf.MANAGED_BY_LABEL}={mf.MANAGED_BY}"
                )
            except ApiException as exc:
                if exc.status == 404:  # namespace not created yet
                    return []
                raise
        return [self._info(d) for d in found.items]

    # ---- commands

    def create(self, payload: ContainerCreatePayload, *, command_key: str, progress: ProgressFn) -> ContainerResult:
        """Apply Deployment, Service and Ingress; returns the existing workload for a repeated key."""
        wid = mf.workload_id(command_key)
        secret_ref = mf.pull_secret_name(payload.name) if payload.registry_username else ""
        try:
            objects = mf.build_manifests(
                payload, command_key=command_key, namespace=self.namespace, pull_secret_ref=secret_ref
            )
        except ValueError as exc:
            raise CommandFailed("invalid_payload", str(exc)) from None
        with self._lock:
            self._ensure_namespace()
            existing = self._by_workload(wid)
            if existing is not None:
                progress(f"deployment for this command already exists: {existing.metadata.name}")
                return self._result(existing, existed=True)
            name = objects[0]["metadata"]["name"]
            apps, core, net = self._apps(), self._core(), self._net()
            if secret_ref:
                secret = mf.pull_secret(payload, command_key=command_key, namespace=self.namespace)
                try:
                    core.create_namespaced_secret(self.namespace, secret)
                except ApiException as exc:
                    if exc.status != 409:
                        raise CommandFailed("internal", f"creating the pull secret failed: {exc.status}") from None
                    core.replace_namespaced_secret(secret_ref, self.namespace, secret)
                progress(f"stored registry credentials in secret {self.namespace}/{secret_ref}")
            try:
                deployment = apps.create_namespaced_deployment(self.namespace, objects[0])
            except ApiException as exc:
                if exc.status == 409:
                    raise CommandFailed(
                        "conflict", f"a deployment named {name!r} already exists in {self.namespace}"
                    ) from None
                raise CommandFailed(
                    "internal", f"creating deployment {name} failed: {exc.status} {exc.reason}"
                ) from None
            progress(f"created deployment {self.namespace}/{name}", data={"container_id": wid})
            for obj in objects[1:]:
                create = core.create_namespaced_service if obj["kind"] == "Service" else net.create_namespaced_ingress
                try:
                    create(self.namespace, obj)
                except ApiException as exc:
                    if exc.status != 409:
                        raise CommandFailed(
                            "internal", f"creating {obj['kind']} {name} failed: {exc.status} {exc.reason}"
                        ) from None
                progress(f"created {obj['kind'].lower()} {self.namespace}/{name}")
            return self._result(deployment, existed=False)

    def _scale(self, payload: ContainerRefPayload, replicas: int) -> ContainerResult:
        deployment = self._ours(payload.container)
        patched = self._apps().patch_namespaced_deployment(
            deployment.metadata.name, self.namespace, {"spec": {"replicas": replicas}}
        )
        return self._result(patched)

    def destroy(self, payload: ContainerRefPayload) -> ContainerResult:
        """Delete the Deployment, Service and Ingress; already gone is fine."""
        try:
            deployment = self._ours(payload.container)
        except CommandFailed as exc:
            if exc.code == "not_found" and not exc.data.get("foreign"):
                return ContainerResult(container_id=payload.container, status="missing")
            raise
        name = deployment.metadata.name
        deletions = (
            self._apps().delete_namespaced_deployment,
            self._core().delete_namespaced_service,
            self._net().delete_namespaced_ingress,
        )
        targets = [(delete, name) for delete in deletions]
        for secret in deployment.spec.template.spec.image_pull_secrets or []:
            targets.append((self._core().delete_namespaced_secret, secret.name))
        for delete, target in targets:
            try:
                delete(target, self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        labels = deployment.metadata.labels or {}
        return ContainerResult(container_id=labels.get(mf.WORKLOAD_LABEL, ""), name=name, status="missing")

    # ---- helpers

    def _by_workload(self, wid: str) -> Any | None:
        selector = f"{mf.MANAGED_BY_LABEL}={mf.MANAGED_BY},{mf.WORKLOAD_LABEL}={wid}"
        try:
            found = self._apps().list_namespaced_deployment(self.namespace, label_selector=selector)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found.items[0] if found.items else None

    def _ours(self, ref: str) -> Any:
        """The Deployment for a container id (workload id) or name; `not_found` otherwise."""
        deployment = self._by_workload(ref) if ref.startswith("ct-") else None
        if deployment is None:
            try:
                name = mf.resource_name(ref)
            except ValueError:
                raise CommandFailed("not_found", f"no workload {ref!r} in {self.namespace}") from None
            try:
                deployment = self._apps().read_namespaced_deployment(name, self.namespace)
            except ApiException as exc:
                if exc.status == 404:
                    raise CommandFailed("not_found", f"no workload {ref!r} in {self.namespace}") from None
                raise
            if (deployment.metadata.labels or {}).get(mf.MANAGED_BY_LABEL) != mf.MANAGED_BY:
                raise CommandFailed("not_found", f"deployment {ref!r} is not managed by CleverThis", foreign=True)
        return deployment

    @staticmethod
    def _status(deployment: Any) -> str:
        wanted = deployment.spec.replicas if deployment.spec.replicas is not None else 1
        if wanted == 0:
            return "stopped"
        ready = (deployment.status.ready_replicas if deployment.status else 0) or 0
        return "running" if ready >= 1 else "created"

    def _info(self, deployment: Any) -> ContainerInfo:
        meta = deployment.metadata
        containers = deployment.spec.template.spec.containers or []
        return ContainerInfo(
            container_id=(meta.labels or {}).get(mf.WORKLOAD_LABEL, meta.name),
            name=meta.name,
            image=containers[0].image if containers else "",
            status=self._status(deployment),
            command_key=(meta.annotations or {}).get(mf.COMMAND_KEY_ANNOTATION, ""),
            labels=dict(meta.labels or {}),
        )

    def _result(self, deployment: Any, *, existed: bool | None = None) -> ContainerResult:
        info = self._info(deployment)
        return ContainerResult(
            container_id=info.container_id,
            name=info.name,
            namespace=self.namespace,
            status=info.status,
            existed=existed,
        )
