"""Cores of their own for CPU endpoint servers: each vLLM CPU server is bound to cores no other live server
of this agent holds (vLLM's `VLLM_CPU_OMP_THREADS_BIND`, `OMP_NUM_THREADS` and the process's affinity), so a
rolling update's replacement loads beside its old replica instead of on its core. Without `VLLM_CPU_OMP_THREADS_BIND`
every vLLM CPU server binds core 0."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable

from agent.protocol.cpu_engine import CPU_ENDPOINT_CORES


def node_cores() -> list[int]:
    """The cores this agent may run on (its affinity), in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def allocate_cores(held: Iterable[Iterable[int]], *, cores: list[int], count: int = CPU_ENDPOINT_CORES) -> list[int]:
    """`count` cores for a new server: free ones (held by no live server, `held`) first, in order; where too
    few are free, the least shared of the others (placement admits no more servers than the node's cores,
    so this happens only to servers started outside it)."""
    use = Counter(core for cores_of in held for core in cores_of)
    ranked = sorted(cores, key=lambda core: (use[core], core))
    return sorted(ranked[: max(1, min(count, len(cores)))])


def cpu_list(cores: list[int]) -> str:
    """`[0, 1, 2, 5]` → `"0-2,5"`: the form `VLLM_CPU_OMP_THREADS_BIND` (libnuma's cpu string) takes."""
    parts: list[str] = []
    for core in sorted(cores):
        if parts and _last(parts[-1]) == core - 1:
            first = parts[-1].split("-")[0]
            parts[-1] = f"{first}-{core}"
        else:
            parts.append(str(core))
    return ",".join(parts)


def _last(part: str) -> int:
    return int(part.split("-")[-1])


def bind_env(env: dict[str, str], cores: list[int]) -> dict[str, str]:
    """The server's environment bound to `cores`: vLLM's OpenMP threads pinned there, one thread per core."""
    bound = dict(env)
    bound["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(cores)
    bound["OMP_NUM_THREADS"] = str(len(cores))
    return bound


def pin_process(pid: int, cores: list[int]) -> None:
    """Set the affinity of a just-started server (its children inherit it); a vanished pid is left alone."""
    try:
        os.sched_setaffinity(pid, cores)
    except (AttributeError, OSError):
        pass
