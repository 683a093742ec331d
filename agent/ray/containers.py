"""The container engine of the docker runtime: what it must do (`RayContainers`) and the Docker SDK's.

An engine that does not answer is `docker_unavailable`; an image that cannot be pulled is
`image_pull_failed`; the engine refusing a port or memory is `conflict` / `insufficient_memory`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol

from agent.errors import CommandFailed


class RayContainers(Protocol):
    """What the docker runtime needs from a container engine."""

    def run(self, spec: dict[str, Any]) -> str:
        """Run `spec` (a `docker_run_spec`), pulling its image if missing; its id (a running one is kept)."""
        ...

    def stop(self, name: str, *, timeout_s: int) -> bool:
        """Stop and remove container `name`; False when there was none."""
        ...

    def exec(self, name: str, argv: list[str], *, timeout_s: float) -> tuple[int, str]:
        """Run `argv` in container `name`; (exit code, combined output)."""
        ...

    def state(self, name: str) -> dict[str, Any] | None:
        """The engine's ``State`` of container `name` (Running, ExitCode, OOMKilled…); None when absent."""
        ...

    def logs(self, name: str, *, lines: int) -> str:
        """The last `lines` lines of container `name`'s output ('' when absent)."""
        ...


def short_reason(exc: BaseException | str, limit: int = 300) -> str:
    """One line of an engine error for a user: the explanation, never a traceback."""
    text = str(getattr(exc, "explanation", None) or exc)
    if "Traceback (most recent call last)" in text:
        head, _, tail = text.partition("Traceback (most recent call last)")
        lines = [line for line in tail.splitlines() if line.strip()]
        text = f"{head.strip()} {lines[-1].strip() if lines else ''}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_PORT_MARKERS = ("address already in use", "port is already allocated", "bind: address")
_MEMORY_MARKERS = ("cannot allocate memory", "out of memory", "memory limit")


class DockerRayContainers:
    """`RayContainers` on the Docker engine (or Podman's Docker API) via the docker SDK.

    An engine that does not answer is `docker_unavailable`; an image that cannot be pulled is
    `image_pull_failed`; the engine refusing a port or memory is `conflict` / `insufficient_memory`.
    """

    def __init__(self, client: Any = None, *, base_url: str | None = None) -> None:
        self._client = client
        self.base_url = base_url

    @contextlib.contextmanager
    def _engine(self) -> Any:
        import docker
        import requests

        try:
            if self._client is None:
                client = docker.DockerClient(base_url=self.base_url) if self.base_url else docker.from_env()
                client.ping()
                self._client = client
            yield self._client
        except docker.errors.APIError as exc:
            if exc.status_code and exc.status_code >= 500 and "connection" in str(exc).lower():
                raise CommandFailed("docker_unavailable", f"the container engine failed: {short_reason(exc)}") from None
            raise
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
            self._client = None
            raise CommandFailed(
                "docker_unavailable", f"the container engine is not answering: {short_reason(exc)}"
            ) from None

    def _ensure_image(self, client: Any, image: str) -> None:
        import docker

        try:
            client.images.get(image)
            return
        except docker.errors.ImageNotFound:
            pass
        try:
            client.images.pull(image)
            client.images.get(image)
        except docker.errors.APIError as exc:
            raise CommandFailed(
                "image_pull_failed", f"pulling {image} failed: {short_reason(exc)}", image=image
            ) from None

    def run(self, spec: dict[str, Any]) -> str:
        import docker

        with self._engine() as client:
            try:
                existing = client.containers.get(spec["name"])
            except docker.errors.NotFound:
                existing = None
            if existing is not None:
                if existing.status == "running":
                    return existing.id
                existing.remove(force=True)  # a stopped leftover: start afresh
            self._ensure_image(client, spec["image"])
            kwargs = {k: v for k, v in spec.items() if k != "stop_timeout"}
            try:
                return client.containers.run(**kwargs).id
            except docker.errors.ImageNotFound as exc:
                raise CommandFailed("image_pull_failed", f"image {spec['image']}: {short_reason(exc)}") from None
            except docker.errors.APIError as exc:
                with contextlib.suppress(docker.errors.APIError):
                    client.containers.get(spec["name"]).remove(force=True)
                lowered = str(exc).lower()
                if any(marker in lowered for marker in _PORT_MARKERS):
                    raise CommandFailed("conflict", f"port already in use: {short_reason(exc)}") from None
                if any(marker in lowered for marker in _MEMORY_MARKERS):
                    raise CommandFailed("insufficient_memory", short_reason(exc)) from None
                raise CommandFailed("internal", f"the engine refused {spec['name']}: {short_reason(exc)}") from None

    def stop(self, name: str, *, timeout_s: int) -> bool:
        import docker

        with self._engine() as client:
            try:
                container = client.containers.get(name)
            except docker.errors.NotFound:
                return False
            with contextlib.suppress(docker.errors.APIError):
                container.stop(timeout=timeout_s)
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
            return True

    def exec(self, name: str, argv: list[str], *, timeout_s: float) -> tuple[int, str]:
        import docker

        with self._engine() as client:
            try:
                container = client.containers.get(name)
                code, output = container.exec_run(argv, demux=False)
            except docker.errors.NotFound:
                raise CommandFailed("not_found", f"container {name} does not exist") from None
            except docker.errors.APIError as exc:  # e.g. the container stopped
                raise CommandFailed("not_found", f"container {name} is not running: {short_reason(exc)}") from None
            return int(code or 0), (output or b"").decode("utf-8", "replace")

    def state(self, name: str) -> dict[str, Any] | None:
        import docker

        with self._engine() as client:
            try:
                return dict(client.containers.get(name).attrs.get("State") or {})
            except docker.errors.NotFound:
                return None

    def logs(self, name: str, *, lines: int) -> str:
        import docker

        with self._engine() as client:
            try:
                return client.containers.get(name).logs(tail=lines).decode("utf-8", "replace")
            except docker.errors.NotFound:
                return ""


def memory_bytes(text: str | None) -> int:
    """'512m' / '2g' / '1073741824' → bytes (0 for none)."""
    if not text:
        return 0
    text = text.strip().lower().rstrip("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def available_memory_bytes() -> int:
    """MemAvailable of this machine (0 when unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
