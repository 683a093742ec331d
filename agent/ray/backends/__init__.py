"""One backend class per Ray runtime, all behind `RayBackend`: ``process``, ``docker`` and ``kuberay``.

The `ray.*` command handler (`agent.ray.commands`) picks one by the payload's ``runtime``.
"""

from agent.ray.backends.base import MemberFile, RayBackend
from agent.ray.backends.docker import DockerBackend
from agent.ray.backends.kuberay import KubeRayBackend
from agent.ray.backends.process import ProcessBackend

__all__ = ["DockerBackend", "KubeRayBackend", "MemberFile", "ProcessBackend", "RayBackend"]
