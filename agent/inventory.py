"""What this machine is and how busy it is: host facts, GPUs (nvidia-ml-py) and utilization.

No GPU, or no NVIDIA driver at all, is a normal report (an empty GPU list), never an error.
"""

from __future__ import annotations

import logging
import platform
import socket
import time

import psutil

from agent.protocol import GpuInfo, Heartbeat, HostFacts

log = logging.getLogger("agent.inventory")


def agent_version() -> str:
    """This agent's version (`agent.update.version`)."""
    from agent.update.version import agent_version as version

    return version()


def detect_gpus() -> list[GpuInfo]:
    """Every NVIDIA GPU with memory and utilization; [] when there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        gpus: list[GpuInfo] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                utilization = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except pynvml.NVMLError:
                utilization = 0.0
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            gpus.append(
                GpuInfo(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    memory_total_mb=int(memory.total // (1024 * 1024)),
                    memory_used_mb=int(memory.used // (1024 * 1024)),
                    utilization_percent=utilization,
                )
            )
        return gpus
    except pynvml.NVMLError as exc:
        log.warning("GPU enumeration failed, reporting no GPU: %s", exc)
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def host_facts() -> HostFacts:
    """Static facts sent at registration and on every connect."""
    return HostFacts(
        hostname=socket.gethostname(),
        os=f"{platform.system()} {platform.release()}",
        arch=platform.machine(),
        cpu_count=psutil.cpu_count() or 0,
        memory_total_mb=int(psutil.virtual_memory().total // (1024 * 1024)),
        agent_version=agent_version(),
        gpus=detect_gpus(),
    )


def heartbeat(containers_running: int = 0) -> Heartbeat:
    """Current CPU, memory and GPU utilization as a heartbeat frame."""
    memory = psutil.virtual_memory()
    return Heartbeat(
        cpu_percent=float(psutil.cpu_percent(interval=None)),
        memory_percent=float(memory.percent),
        memory_used_mb=int((memory.total - memory.available) // (1024 * 1024)),
        memory_total_mb=int(memory.total // (1024 * 1024)),
        gpus=detect_gpus(),
        containers_running=containers_running,
        sent_at=time.time(),
    )
