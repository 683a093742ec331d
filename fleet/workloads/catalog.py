"""The model catalog's rules, without the database: the YAML file's schema (`load_catalog`), the memory a model
needs at a context and batch (`vram_needed_mb`, `cpu_memory_needed_mb`) and where it fits on one node
(`fit_on_node`: tensor parallel over that node's free GPUs, or its memory on a CPU node).

The formula (documented in the README and in `catalog.yaml`):
  weights  = params x bytes per parameter (the quantization's)
  KV cache = 2 (K and V) x layers x kv_heads x head_dim x KV bytes (2: fp16) x context x batch
  per GPU  = (weights + KV cache) / tensor_parallel + GPU_OVERHEAD_MB
A GPU counts as free when it reports at least the per-GPU need free and the node has GPUs no live replica
holds (`held_gpus`); what a GPU offers is its free memory, at most vLLM's share of it (0.9). CPU nodes run
vLLM's CPU build in float32: weights at 4 bytes a parameter, a float32 KV cache and CPU_OVERHEAD_MB.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.protocol import DEFAULT_GPU_MEMORY_UTILIZATION, MODEL_ID_RE, REVISION_RE, check_server_args

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")
GPU_OVERHEAD_MB = 1536  # per GPU: CUDA context, CUDA graphs, activation peak
CPU_OVERHEAD_MB = 2560  # the CPU build's own memory besides weights and KV cache (README: ~2.5 GB)
KV_BYTES = 2  # fp16/bf16 KV cache
TENSOR_PARALLEL = (1, 2, 4, 8)
MIB = 1024 * 1024
MAX_NAME = 100
MAX_QUANTIZATIONS = 8


class CatalogError(ValueError):
    """A catalog entry that breaks the schema: `problems` maps each field to its message."""

    def __init__(self, problems: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in problems.items()))
        self.problems = problems


@dataclass(frozen=True)
class Quantization:
    """One published variant: its bytes per parameter and, when another repository holds it, that one."""

    name: str
    bytes_per_param: float
    model_id: str = ""


@dataclass(frozen=True)
class ModelSpec:
    """What the fit computation needs of a model (a curated entry or a workspace's private model)."""

    params_b: float
    context_length: int = 0
    layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    attention_heads: int = 0
    quantizations: tuple[Quantization, ...] = (Quantization("bf16", 2.0),)

    def kv_bytes_per_token(self, kv_bytes: int = KV_BYTES) -> int:
        """K and V of every layer for one token (0 when the shape is unknown)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_bytes

    def quantization(self, name: str | None) -> Quantization:
        """The named variant, else the first (full precision)."""
        return next((q for q in self.quantizations if q.name == name), self.quantizations[0])


@dataclass(frozen=True)
class CatalogEntry:
    """One model of the catalog file, checked."""

    name: str
    model_id: str
    spec: ModelSpec
    revision: str = "main"
    description: str = ""
    server_args: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Fit:
    """Where one model fits on one node: `device` gpu or cpu, its tensor parallel size, the need and what the
    node offers (per GPU on GPUs, in all on CPU), in MiB; `fits` False with `reason` when it does not."""

    fits: bool
    device: str
    tensor_parallel: int
    needed_mb: int
    offered_mb: int
    reason: str = ""


def vram_needed_mb(spec: ModelSpec, *, quantization: str | None, context: int, batch: int, tp: int = 1) -> int:
    """VRAM (MiB) per GPU for `spec` at `context` tokens x `batch` sequences over `tp` GPUs."""
    weights = spec.params_b * 1e9 * spec.quantization(quantization).bytes_per_param
    kv = spec.kv_bytes_per_token() * context * batch
    return math.ceil((weights + kv) / tp / MIB) + GPU_OVERHEAD_MB


def cpu_memory_needed_mb(spec: ModelSpec, *, context: int, batch: int) -> int:
    """Memory (MiB) vLLM's CPU build needs: float32 weights and KV cache, and its own."""
    weights = spec.params_b * 1e9 * 4
    kv = spec.kv_bytes_per_token(kv_bytes=4) * context * batch
    return math.ceil((weights + kv) / MIB) + CPU_OVERHEAD_MB


def fit_on_node(
    spec: ModelSpec,
    *,
    gpus: Sequence[Mapping[str, Any]],
    held_gpus: int,
    memory_free_mb: int,
    quantization: str | None,
    context: int,
    batch: int,
) -> Fit:
    """Whether `spec` fits on a node with `gpus` (its reported GPUs) of which live replicas hold `held_gpus`,
    the smallest tensor parallel size first; a node without GPUs by its free memory."""
    if not gpus:
        need = cpu_memory_needed_mb(spec, context=context, batch=batch)
        if need <= memory_free_mb:
            return Fit(True, "cpu", 0, need, memory_free_mb)
        return Fit(False, "cpu", 0, need, memory_free_mb, f"needs {need} MiB of memory, {memory_free_mb} free")
    offers = sorted((_gpu_offer(g) for g in gpus), reverse=True)
    free_gpus = max(len(gpus) - held_gpus, 0)
    short: Fit | None = None  # the GPUs' memory would do, but replicas hold too many of them
    tight = Fit(False, "gpu", 0, 0, 0, "no tensor parallel size divides its attention heads")
    for tp in TENSOR_PARALLEL:
        if tp > len(gpus):
            break
        if spec.attention_heads and spec.attention_heads % tp:
            continue  # vLLM splits attention heads evenly over the GPUs
        need = vram_needed_mb(spec, quantization=quantization, context=context, batch=batch, tp=tp)
        usable = [o for o in offers[:free_gpus] if o >= need]
        if len(usable) >= tp:
            return Fit(True, "gpu", tp, need, usable[tp - 1])
        if offers[tp - 1] >= need and short is None:
            short = Fit(
                False,
                "gpu",
                tp,
                need,
                offers[tp - 1],
                f"needs {tp} GPU(s) of {need} MiB, {free_gpus} of {len(gpus)} GPU(s) free "
                "(endpoint replicas hold the rest)",
            )
        tight = Fit(
            False,
            "gpu",
            tp,
            need,
            offers[tp - 1],
            f"needs {need} MiB on each of {tp} GPU(s), {offers[tp - 1]} MiB on each",
        )
    return short or tight


def _gpu_offer(gpu: Mapping[str, Any]) -> int:
    total = int(gpu.get("memory_total_mb", 0))
    free = total - int(gpu.get("memory_used_mb", 0))
    return max(min(free, math.floor(total * DEFAULT_GPU_MEMORY_UTILIZATION)), 0)


# ---- the file


def load_catalog(path: Path | None = None) -> tuple[int, list[CatalogEntry]]:
    """(version, entries) of the catalog file; CatalogError naming the entry and field on any problem."""
    try:
        data = yaml.safe_load((path or CATALOG_PATH).read_text())
    except yaml.YAMLError as exc:
        raise CatalogError({"file": f"Not YAML: {str(exc).splitlines()[0]}"}) from None
    if not isinstance(data, dict) or not isinstance(data.get("version"), int) or data["version"] < 1:
        raise CatalogError({"version": "The catalog needs a positive integer `version`."})
    models = data.get("models")
    if not isinstance(models, list):
        raise CatalogError({"models": "The catalog needs a list of `models`."})
    entries, names = [], set()
    for index, item in enumerate(models):
        try:
            entry = parse_entry(item)
        except CatalogError as exc:
            raise CatalogError({f"models[{index}].{k}": v for k, v in exc.problems.items()}) from None
        if entry.name in names:
            raise CatalogError({f"models[{index}].name": f"{entry.name!r} appears twice."})
        names.add(entry.name)
        entries.append(entry)
    return data["version"], entries


def parse_entry(item: Any) -> CatalogEntry:
    """One catalog entry checked (every field's problem at once)."""
    if not isinstance(item, dict):
        raise CatalogError({"": "Each model is a mapping."})
    problems: dict[str, str] = {}
    unknown = set(item) - {*ENTRY_FIELDS, "name", "model_id", "revision", "description", "server_args", "tags"}
    if unknown:
        problems["fields"] = f"Unknown field(s): {', '.join(sorted(unknown))}."
    name = item.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        problems["name"] = f"A name of 1 to {MAX_NAME} characters."
    model_id = item.get("model_id")
    if not isinstance(model_id, str) or not _matches(MODEL_ID_RE, model_id):
        problems["model_id"] = "A Hub repository id (owner/name)."
    revision = item.get("revision", "main")
    if not isinstance(revision, str) or not _matches(REVISION_RE, revision):
        problems["revision"] = "A branch, tag or commit."
    args = item.get("server_args", [])
    checked, arg_problems = check_server_args(args)
    if arg_problems:
        problems["server_args"] = " ".join(arg_problems)
    tags = item.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and len(t) <= 32 for t in tags):
        problems["tags"] = "A list of short words."
    try:
        spec = parse_spec(item)
    except CatalogError as exc:
        problems.update(exc.problems)
        spec = None
    if problems or spec is None:
        raise CatalogError(problems)
    return CatalogEntry(
        name=name,
        model_id=model_id,
        revision=revision,
        spec=spec,
        description=str(item.get("description", ""))[:500],
        server_args=checked,
        tags=list(tags),
    )


# Each size field: (smallest, largest, required)
ENTRY_FIELDS: dict[str, tuple[float, float, bool]] = {
    "params_b": (0.000001, 2000, True),
    "context_length": (0, 10_000_000, False),
    "layers": (0, 1000, False),
    "kv_heads": (0, 1000, False),
    "head_dim": (0, 4096, False),
    "attention_heads": (0, 1000, False),
    "quantizations": (0, 0, False),
}


def parse_spec(item: Mapping[str, Any]) -> ModelSpec:
    """The sizes of a model (a catalog entry, or a private model's fields); CatalogError on a bad one."""
    problems: dict[str, str] = {}
    values: dict[str, Any] = {}
    for name, (low, high, required) in ENTRY_FIELDS.items():
        if name == "quantizations":
            continue
        value = item.get(name)
        if value is None and not required:
            values[name] = 0
            continue
        integral = name != "params_b"
        if isinstance(value, bool) or not isinstance(value, int if integral else int | float):
            problems[name] = "A whole number." if integral else "A number (billions of parameters)."
        elif not low <= value <= high:
            problems[name] = f"From {low:g} to {high:g}."
        else:
            values[name] = value
    quantizations = []
    raw = item.get("quantizations") or [{"name": "bf16", "bytes_per_param": 2}]
    if not isinstance(raw, list) or len(raw) > MAX_QUANTIZATIONS:
        problems["quantizations"] = f"A list of at most {MAX_QUANTIZATIONS} variants."
        raw = []
    for q in raw:
        ok = isinstance(q, dict) and isinstance(q.get("name"), str) and 0 < len(q["name"]) <= 32
        per = q.get("bytes_per_param") if isinstance(q, dict) else None
        ok = ok and isinstance(per, int | float) and not isinstance(per, bool) and 0.1 <= per <= 8
        repo = q.get("model_id", "") if isinstance(q, dict) else ""
        ok = ok and isinstance(repo, str) and (not repo or _matches(MODEL_ID_RE, repo))
        if not ok:
            problems["quantizations"] = "Each variant: a name, bytes_per_param from 0.1 to 8, an optional model_id."
            break
        quantizations.append(Quantization(q["name"], float(per), repo))
    if problems:
        raise CatalogError(problems)
    return ModelSpec(
        params_b=float(values["params_b"]),
        context_length=values["context_length"],
        layers=values["layers"],
        kv_heads=values["kv_heads"],
        head_dim=values["head_dim"],
        attention_heads=values["attention_heads"],
        quantizations=tuple(quantizations),
    )


def _matches(pattern: str, value: str) -> bool:
    return bool(re.fullmatch(pattern, value)) and ".." not in value and len(value) <= 200
