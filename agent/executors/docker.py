"""Standalone mode: workloads are containers on the node's Docker engine (or Podman's compatible API).

Every container we create carries ``io.cleverthis.managed=true`` and
``io.cleverthis.command-key=<idempotency key>``: `list_containers` reports only those, a second
``container.create`` with the same key returns the container the first one made, and start/stop/destroy
refuse to touch containers that are not ours.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest

from agent.errors import CommandFailed
from agent.executors.base import ProgressFn
from agent.protocol import ContainerCreatePayload, ContainerInfo, ContainerRefPayload, ContainerResult

MANAGED_LABEL = "io.cleverthis.managed"
COMMAND_KEY_LABEL = "io.cleverthis.command-key"
_AUTH_MARKERS = ("unauthorized", "authentication required", "denied", "401", "forbidden", "403")
_PROGRESS_INTERVAL_S = 0.5


def _status(docker_status: str) -> str:
    """Docker's container state as one of ContainerInfo's statuses."""
    if docker_status in ("created", "running", "exited"):
        return docker_status
    if docker_status in ("paused", "restarting"):
        return "running"
    if docker_status in ("dead", "removing", "stopped", "configured"):
        return "exited"
    return docker_status or "missing"


def split_image(image: str) -> tuple[str, str]:
    """``repo[:tag]`` (or ``repo@digest``) as (repository, tag-or-digest); tag defaults to latest."""
    if "@" in image:
        repo, digest = image.split("@", 1)
        return repo, digest
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = image.rsplit(":", 1)
        return repo, tag
    return image, "latest"


class DockerExecutor:
    """Runs container commands against one Docker-compatible engine (`base_url`, else the environment)."""

    mode = "standalone"

    def __init__(self, base_url: str | None = None, *, timeout_s: int = 120) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._client: docker.DockerClient | None = None
        self._lock = threading.Lock()

    # ---- engine connection

    def _docker(self) -> docker.DockerClient:
        if self._client is not None:
            return self._client
        try:
            if self.base_url:
                client = docker.DockerClient(base_url=self.base_url, timeout=self.timeout_s)
            else:
                client = docker.from_env(timeout=self.timeout_s)
            client.ping()
        except (DockerException, requests.exceptions.RequestException) as exc:
            raise CommandFailed("docker_unavailable", f"Docker engine not reachable: {exc}") from None
        self._client = client
        return client

    # ---- Executor interface

    def execute(self, command_type: str, payload: Any, *, command_key: str, progress: ProgressFn) -> ContainerResult:
        """Run one container.* command; see `agent.executors.base.Executor`."""
        try:
            if command_type == "container.create":
                return self.create(payload, command_key=command_key, progress=progress)
            if command_type == "container.start":
                return self.start(payload)
            if command_type == "container.stop":
                return self.stop(payload)
            if command_type == "container.destroy":
                return self.destroy(payload)
        except requests.exceptions.ConnectionError as exc:
            self._client = None
            raise CommandFailed("docker_unavailable", f"lost the Docker engine: {exc}") from None
        raise CommandFailed("unknown_command", f"the docker executor does not run {command_type!r}")

    def list_containers(self) -> list[ContainerInfo]:
        """Every container labelled as ours, running or not, from one listing call.

        The engine's list answer already carries id, names, image, state and labels, so no container
        is inspected one by one: one removed meanwhile cannot fail the listing (the SDK's
        `containers.list` inspects each and raised `NotFound`). Any engine error is `docker_unavailable`.
        """
        try:
            rows = self._docker().api.containers(all=True, filters={"label": f"{MANAGED_LABEL}=true"})
        except requests.exceptions.ConnectionError as exc:
            self._client = None
            raise CommandFailed("docker_unavailable", f"lost the Docker engine: {exc}") from None
        except (DockerException, requests.exceptions.RequestException) as exc:
            raise CommandFailed("docker_unavailable", f"the Docker engine could not list containers: {exc}") from None
        return [self._summary_info(row) for row in rows]

    # ---- commands

    def create(self, payload: ContainerCreatePayload, *, command_key: str, progress: ProgressFn) -> ContainerResult:
        """Create (and by default start) the container; returns the existing one for a repeated key."""
        client = self._docker()
        existing = self._by_command_key(command_key)
        if existing is None:
            # Pull outside the lock (pulls are slow and other commands must not wait behind them).
            self._ensure_image(payload, progress)
        with self._lock:
            existing = self._by_command_key(command_key)
            if existing is not None:
                progress(f"container for this command already exists: {existing.name}")
                return self._result(existing, existed=True)
            labels = {**payload.labels, MANAGED_LABEL: "true", COMMAND_KEY_LABEL: command_key}
            kwargs: dict[str, Any] = {
                "name": payload.name,
                "labels": labels,
                "environment": dict(payload.env),
                "detach": True,
            }
            if payload.command:
                kwargs["command"] = list(payload.command)
            if payload.ports:
                kwargs["ports"] = {f"{p.container_port}/{p.protocol}": (p.host_port or None) for p in payload.ports}
            if payload.cpu > 0:
                kwargs["nano_cpus"] = int(payload.cpu * 1_000_000_000)
            if payload.memory_mb > 0:
                kwargs["mem_limit"] = f"{payload.memory_mb}m"
            if payload.gpus > 0:
                kwargs["device_requests"] = [DeviceRequest(count=payload.gpus, capabilities=[["gpu"]])]
            try:
                container = client.containers.create(payload.image, **kwargs)
            except APIError as exc:
                # Docker answers 409 for a taken name; Podman's compatible API answers 500 saying so.
                if exc.status_code == 409 or "already in use" in str(exc.explanation or ""):
                    raise CommandFailed("conflict", f"a container named {payload.name!r} already exists") from None
                raise CommandFailed("internal", f"creating the container failed: {exc.explanation or exc}") from None
            progress(f"created container {payload.name}", data={"container_id": container.id})
            if payload.start:
                try:
                    container.start()
                except APIError as exc:
                    raise CommandFailed(
                        "internal",
                        f"starting the container failed: {exc.explanation or exc}",
                        container_id=container.id,
                    ) from None
            container.reload()
            return self._result(container, existed=False)

    def start(self, payload: ContainerRefPayload) -> ContainerResult:
        """Start a stopped container of ours (no-op if it already runs)."""
        container = self._ours(payload.container)
        if container.status != "running":
            container.start()
            container.reload()
        return self._result(container)

    def stop(self, payload: ContainerRefPayload) -> ContainerResult:
        """Stop gracefully: SIGTERM, then SIGKILL after `timeout_s`."""
        container = self._ours(payload.container)
        if container.status == "running":
            container.stop(timeout=payload.timeout_s)
            container.reload()
        return self._result(container)

    def destroy(self, payload: ContainerRefPayload) -> ContainerResult:
        """Remove the container (stopping it first) and its anonymous volumes; already gone is fine."""
        try:
            container = self._ours(payload.container)
        except CommandFailed as exc:
            if exc.code == "not_found" and not exc.data.get("foreign"):
                return ContainerResult(container_id=payload.container, status="missing")
            raise
        if container.status == "running":
            container.stop(timeout=payload.timeout_s)
        try:
            container.remove(v=True, force=True)
        except NotFound:
            pass
        return ContainerResult(container_id=container.id, name=container.name, status="missing")

    # ---- helpers

    def _by_command_key(self, command_key: str) -> Any | None:
        found = self._docker().containers.list(
            all=True, filters={"label": [f"{MANAGED_LABEL}=true", f"{COMMAND_KEY_LABEL}={command_key}"]}
        )
        return found[0] if found else None

    def _ours(self, ref: str) -> Any:
        try:
            container = self._docker().containers.get(ref)
        except NotFound:
            raise CommandFailed("not_found", f"no container {ref!r} on this node") from None
        if container.labels.get(MANAGED_LABEL) != "true":
            raise CommandFailed("not_found", f"container {ref!r} is not managed by CleverThis", foreign=True)
        return container

    def _ensure_image(self, payload: ContainerCreatePayload, progress: ProgressFn) -> None:
        client = self._docker()
        try:
            client.images.get(payload.image)
            return
        except ImageNotFound:
            pass
        repo, tag = split_image(payload.image)
        auth = None
        if payload.registry_username:
            auth = {"username": payload.registry_username, "password": payload.registry_password}
        progress(f"pulling image {payload.image}", percent=0.0)
        layers: dict[str, tuple[int, int]] = {}
        last_report = 0.0
        try:
            for event in client.api.pull(repo, tag=tag, stream=True, decode=True, auth_config=auth):
                if "error" in event:
                    self._pull_failed(payload.image, str(event.get("error")))
                layer = event.get("id", "")
                detail = event.get("progressDetail") or {}
                if layer and detail.get("total"):
                    layers[layer] = (int(detail.get("current", 0)), int(detail["total"]))
                now = time.monotonic()
                if now - last_report >= _PROGRESS_INTERVAL_S:
                    last_report = now
                    done = sum(c for c, _ in layers.values())
                    total = sum(t for _, t in layers.values())
                    percent = round(100.0 * done / total, 1) if total else None
                    progress(
                        f"pull {payload.image}: {event.get('status', '')}".strip(),
                        percent=percent,
                        data={"bytes_done": done, "bytes_total": total, "layers": len(layers)},
                    )
        except APIError as exc:
            self._pull_failed(payload.image, str(exc.explanation or exc))
        try:
            client.images.get(payload.image)
        except ImageNotFound:
            self._pull_failed(payload.image, "the engine reported no error but the image is not present")
        progress(f"pulled image {payload.image}", percent=100.0)

    @staticmethod
    def _pull_failed(image: str, reason: str) -> None:
        lowered = reason.lower()
        code = "registry_auth_failed" if any(m in lowered for m in _AUTH_MARKERS) else "image_pull_failed"
        raise CommandFailed(code, f"pulling {image} failed: {reason}", image=image, reason=reason)

    @staticmethod
    def _summary_info(row: dict[str, Any]) -> ContainerInfo:
        """A container of the engine's list answer (`GET /containers/json`) as a ContainerInfo."""
        labels = dict(row.get("Labels") or {})
        names = row.get("Names") or [""]
        state = row.get("State")
        if isinstance(state, dict):  # some engines answer the inspect form
            state = state.get("Status", "")
        return ContainerInfo(
            container_id=row.get("Id", ""),
            name=str(names[0]).lstrip("/"),
            image=row.get("Image", ""),
            status=_status(str(state or "")),
            command_key=labels.get(COMMAND_KEY_LABEL, ""),
            labels=labels,
        )

    def _result(self, container: Any, *, existed: bool | None = None) -> ContainerResult:
        ports: dict[str, int] = {}
        for key, bindings in (container.attrs.get("NetworkSettings", {}).get("Ports") or {}).items():
            if bindings:
                ports[key.split("/")[0]] = int(bindings[0]["HostPort"])
        return ContainerResult(
            container_id=container.id,
            name=container.name,
            status=_status(container.status),
            ports=ports,
            existed=existed,
        )
