"""What one endpoint server holds on a node without GPUs (vLLM's CPU build): one definition for both sides.

The control plane's placement counts it against the node's reported cores and memory, as it counts VRAM on
GPU nodes (`fleet.workloads.services.endpoints.placement`); the agent binds each server to cores of its own
(`agent.workloads.cpu_cores`) and gives it this KV cache (`VLLM_CPU_KVCACHE_SPACE`).
"""

from __future__ import annotations

# Cores one CPU server is bound to (`VLLM_CPU_OMP_THREADS_BIND`, `OMP_NUM_THREADS` and its affinity): two
# servers sharing a core starve each other (a replacement loading beside its old replica took ~6 minutes).
CPU_ENDPOINT_CORES = 1
# GiB of KV cache a CPU server gets (`VLLM_CPU_KVCACHE_SPACE`; vLLM's own default is 4).
CPU_KVCACHE_GIB = 1
# What vLLM's own processes take besides the weights and the KV cache (measured with the CPU build: ~3.2 GB
# resident for a tiny model, of which 1 GiB is the KV cache).
CPU_RUNTIME_MB = 2_500
MIB = 1024 * 1024


def cpu_endpoint_memory_mb(*, weights_bytes: int, kvcache_gib: float = CPU_KVCACHE_GIB) -> int:
    """Memory (MB) one CPU server of a model with `weights_bytes` of weights holds: weights, KV cache, runtime."""
    return -(-max(weights_bytes, 0) // MIB) + int(kvcache_gib * 1024) + CPU_RUNTIME_MB
