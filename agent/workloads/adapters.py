"""LoRA adapters on a running endpoint server, loaded and unloaded without a restart through vLLM's runtime API.

A server started with `--enable-lora` (the agent adds it when the start names adapters) runs with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, which opens ``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``; a loaded adapter is listed by the server's ``GET /v1/models`` and answers
requests whose ``model`` is its name. An adapter's weights are a directory on the node (`LoraAdapterRef.path`)
or a Hub repository fetched into the node's model cache when missing. The adapters a server holds are kept in
its record (`adapters`), so the agent reports them and a repeated load or unload answers as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from agent.errors import CommandFailed
from agent.executors.base import ProgressFn
from agent.protocol import (
    EndpointAdapterLoadPayload,
    EndpointAdapterResult,
    EndpointAdapterUnloadPayload,
    LoraAdapterRef,
    ModelDownloadPayload,
)
from agent.workloads.models import ModelCache
from agent.workloads.server_process import server_alive

Records = dict[str, dict[str, Any]]

ENABLE_LORA = "--enable-lora"
RUNTIME_UPDATES_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
LOAD_TIMEOUT_S = 300.0


def lora_enabled(argv: list[str]) -> bool:
    """Whether a server command line turns LoRA on (its last word on it wins, as in vLLM's parser)."""
    flags = [a for a in argv if a in (ENABLE_LORA, "--no-enable-lora")]
    return bool(flags) and flags[-1] == ENABLE_LORA


def adapter_path(models: ModelCache, ref: LoraAdapterRef, progress: ProgressFn) -> Path:
    """The directory holding the adapter's weights on this node: its `path`, or its Hub repository in the
    model cache (downloaded first when missing). CommandFailed(adapter_missing) when there is none."""
    if ref.path:
        path = Path(ref.path)
        if not (path / "adapter_config.json").is_file():
            raise CommandFailed(
                "adapter_missing", f"adapter {ref.name}: {ref.path} on this node holds no adapter_config.json"
            )
        return path
    if not ref.model_id:
        raise CommandFailed("invalid_payload", f"adapter {ref.name} names neither a repository nor a path")
    cached = models.path_for(ref.model_id, ref.revision)
    if cached is None:
        progress(f"fetching adapter {ref.name} ({ref.model_id}@{ref.revision})")
        models.download(ModelDownloadPayload(model_id=ref.model_id, revision=ref.revision), progress)
        cached = models.path_for(ref.model_id, ref.revision)
    if cached is None:
        raise CommandFailed("adapter_missing", f"adapter {ref.name}: {ref.model_id}@{ref.revision} is not cached")
    return cached


def _post(port: int, action: str, body: dict[str, Any]) -> requests.Response:
    try:
        return requests.post(f"http://127.0.0.1:{port}/v1/{action}", json=body, timeout=LOAD_TIMEOUT_S)
    except requests.RequestException as exc:
        raise CommandFailed("adapter_failed", f"the endpoint server did not answer {action}: {exc}") from None


def server_load(port: int, name: str, path: Path) -> None:
    """Ask the server on `port` to load adapter `name` from `path` (one loaded already counts as loaded)."""
    response = _post(port, "load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
    if response.status_code != 200 and "already been loaded" not in response.text:
        raise CommandFailed(
            "adapter_failed",
            f"the endpoint server refused to load adapter {name} ({response.status_code}): {response.text[:500]}",
        )


def server_unload(port: int, name: str) -> None:
    """Ask the server on `port` to unload adapter `name` (one it does not hold counts as unloaded)."""
    response = _post(port, "unload_lora_adapter", {"lora_name": name})
    if response.status_code != 200 and response.status_code not in (400, 404):
        raise CommandFailed(
            "adapter_failed",
            f"the endpoint server refused to unload adapter {name} ({response.status_code}): {response.text[:500]}",
        )


class EndpointAdapters:
    """endpoint.adapter.load / endpoint.adapter.unload on the servers an `EndpointManager` runs: `load` and `save`
    read and write its records (under `lock`), `models` is the node's model cache."""

    def __init__(
        self,
        models: ModelCache,
        lock: threading.RLock,
        load: Callable[[], Records],
        save: Callable[[Records], None],
        *,
        alive: Callable[[dict[str, Any]], bool] = server_alive,
    ) -> None:
        self.models, self.lock, self.load_records, self.save_records = models, lock, load, save
        self.alive = alive  # whether a record's server runs (a rank in a Ray container asks its container)

    def _running(self, endpoint_id: str) -> dict[str, Any]:
        record = self.load_records().get(endpoint_id)
        if record is None or record.get("status") == "stopped" or not self.alive(record):
            raise CommandFailed("not_found", f"no endpoint {endpoint_id} runs on this node", endpoint_id=endpoint_id)
        if record.get("status") == "starting":
            raise CommandFailed("conflict", f"endpoint {endpoint_id} is still starting; it loads its adapters then")
        if not record.get("lora"):
            raise CommandFailed(
                "lora_disabled",
                f"endpoint {endpoint_id} was started without {ENABLE_LORA}: restart it with LoRA on to load adapters",
            )
        return record

    def _remember(self, endpoint_id: str, name: str, loaded: bool) -> list[str]:
        with self.lock:
            state = self.load_records()
            record = state.get(endpoint_id, {})
            names = [n for n in record.get("adapters", []) if n != name] + ([name] if loaded else [])
            if endpoint_id in state:
                record["adapters"] = names
                self.save_records(state)
            return names

    def load(self, payload: EndpointAdapterLoadPayload, progress: ProgressFn) -> EndpointAdapterResult:
        """Load one adapter into a running server (fetching its weights first when they are missing)."""
        began = time.monotonic()
        record = self._running(payload.endpoint_id)
        path = adapter_path(self.models, payload.adapter, progress)
        server_load(record["port"], payload.adapter.name, path)
        names = self._remember(payload.endpoint_id, payload.adapter.name, True)
        return EndpointAdapterResult(
            endpoint_id=payload.endpoint_id,
            name=payload.adapter.name,
            status="loaded",
            seconds=round(time.monotonic() - began, 3),
            adapters=names,
        )

    def unload(self, payload: EndpointAdapterUnloadPayload) -> EndpointAdapterResult:
        """Unload one adapter from a running server."""
        began = time.monotonic()
        record = self._running(payload.endpoint_id)
        server_unload(record["port"], payload.name)
        names = self._remember(payload.endpoint_id, payload.name, False)
        return EndpointAdapterResult(
            endpoint_id=payload.endpoint_id,
            name=payload.name,
            status="unloaded",
            seconds=round(time.monotonic() - began, 3),
            adapters=names,
        )

    def load_all(self, port: int, adapters: list[LoraAdapterRef], progress: ProgressFn) -> list[str]:
        """Load a starting server's adapters (its start fails if one cannot be loaded); their names."""
        for ref in adapters:
            server_load(port, ref.name, adapter_path(self.models, ref, progress))
            progress(f"adapter {ref.name} loaded")
        return [ref.name for ref in adapters]
