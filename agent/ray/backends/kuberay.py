"""The ``kuberay`` runtime's backend: the whole Ray cluster is one KubeRay ``RayCluster`` (`agent.ray.kuberay`).

Head start applies or resumes it; stop suspends it or, with ``delete``, deletes it; status is the
resource's status plus the head's Ray API. KubeRay's autoscaler runs the workers, so worker starts and
drains are refused. Only kubernetes and argocd compute clusters have a KubeRay backend.
"""

from __future__ import annotations

from agent import protocol
from agent.errors import CommandFailed
from agent.executors.base import ProgressFn
from agent.ray.backends.base import RayBackend
from agent.ray.kuberay import KubeRayGitOps, KubeRayKube


class KubeRayBackend(RayBackend):
    """Ray clusters as RayCluster resources through `KubeRayKube` (kubernetes) or `KubeRayGitOps` (argocd)."""

    runtime = "kuberay"

    def __init__(self, kuberay: KubeRayKube | KubeRayGitOps | None) -> None:
        self.kuberay = kuberay

    def proxy_targets(self) -> set[tuple[str, int]]:
        return self.kuberay.proxy_targets() if self.kuberay is not None else set()

    def head_start(self, p: protocol.RayHeadStartPayload, progress: ProgressFn) -> protocol.RayNodeStartResult:
        return self._applier().apply(p, progress)

    def worker_start(self, p: protocol.RayWorkerStartPayload, progress: ProgressFn) -> protocol.RayNodeStartResult:
        raise CommandFailed("unsupported", "KubeRay's autoscaler starts the workers of a RayCluster")

    def node_drain(self, p: protocol.RayNodeDrainPayload, progress: ProgressFn) -> protocol.RayNodeDrainResult:
        raise CommandFailed("unsupported", "KubeRay's autoscaler drains the workers of a RayCluster")

    def node_stop(self, p: protocol.RayNodeStopPayload, progress: ProgressFn) -> protocol.RayNodeStopResult:
        applier = self._applier()
        if p.delete:
            return applier.delete(p.cluster_id, progress)
        return applier.suspend(p.cluster_id, progress)

    def status(self, p: protocol.RayStatusPayload, progress: ProgressFn) -> protocol.RayStatusResult:
        return self._applier().status(p)

    def _applier(self) -> KubeRayKube | KubeRayGitOps:
        if self.kuberay is None:
            raise CommandFailed(
                "unsupported", "KubeRay clusters need a kubernetes or argocd compute cluster; this node is standalone"
            )
        return self.kuberay
