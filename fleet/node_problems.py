"""What a node's agent cannot do, from its inventory's `problems`, and what the operator should do about it.

The agent reports each inventory part it could not read (`agent.protocol.InventoryProblem`: the executor
cannot reach Docker or the Kubernetes API, …); the node stays online (its agent is connected) but the
Nodes list and the node page warn with the fix the documents give (Compute Fleet → Kubernetes mode
setup, Troubleshooting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RESTART = "systemctl restart cleverthis-agent"
LOGS = "journalctl -u cleverthis-agent -n 50"


@dataclass(frozen=True)
class NodeProblem:
    """One thing the node's agent cannot do, why (the agent's words) and the fix."""

    part: str  # containers | endpoints | models
    code: str
    message: str  # the agent's own reason
    title: str  # what it means for the operator, one line
    short: str  # the Nodes list's few words
    fix: str  # what to do, in the documents' words
    commands: tuple[str, ...] = ()  # shell commands that help, run on the node


# code → (short, title, fix, commands)
ADVICE: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "kubernetes_unavailable": (
        "No Kubernetes API",
        "The agent cannot reach the Kubernetes API: containers cannot run on this node.",
        "Give the agent Kubernetes credentials on this node: configure kubectl (the agent reads ~/.kube/config "
        "or the KUBECONFIG variable), or create a service account with the cluster-admin role and set "
        "CLEVERTHIS_KUBECONFIG in the agent's service unit to its kubeconfig. The API server must be "
        "reachable from the node. Then restart the agent.",
        (
            "kubectl create serviceaccount cleverthis-agent -n kube-system",
            "kubectl create clusterrolebinding cleverthis-agent-binding --clusterrole=cluster-admin "
            "--serviceaccount=kube-system:cleverthis-agent",
            RESTART,
        ),
    ),
    "docker_unavailable": (
        "Docker unreachable",
        "The agent cannot reach Docker: containers cannot run on this node.",
        "The agent requires Docker. Check that Docker runs on the node (docker info), start it, then restart "
        "the agent.",
        ("docker info", RESTART),
    ),
    "gitops_failed": (
        "GitOps repository unreachable",
        "The agent cannot read the GitOps repository: workloads cannot be deployed through ArgoCD.",
        "Check ARGOCD_GIT_REPO, ARGOCD_GIT_BRANCH and the node's access to that repository, then restart the agent.",
        (LOGS, RESTART),
    ),
    "argocd_sync_failed": (
        "ArgoCD unreachable",
        "The agent cannot reach ArgoCD: workloads cannot be deployed on this node.",
        "Check ARGOCD_SERVER and ARGOCD_TOKEN on the node and that the ArgoCD API is reachable, then restart "
        "the agent.",
        (LOGS, RESTART),
    ),
}
DEFAULT_ADVICE = (
    "Cannot read its {part}",
    "The agent cannot read its {part}.",
    "Check the agent's log on the node for the error, then restart the agent.",
    (LOGS, RESTART),
)


def node_problems(node: Any) -> list[NodeProblem]:
    """The problems the node's connected agent last reported, each with its fix ([] when none or offline)."""
    if not node.connected:  # the inventory is the last one heard: an offline node shows offline instead
        return []
    inventory = node.inventory if isinstance(node.inventory, dict) else {}
    reported = inventory.get("problems")
    if not isinstance(reported, list):
        return []
    problems = []
    for item in reported:
        if not isinstance(item, dict):
            continue
        part, code = str(item.get("part", "")), str(item.get("code", ""))
        short, title, fix, commands = ADVICE.get(code, DEFAULT_ADVICE)
        problems.append(
            NodeProblem(
                part=part,
                code=code,
                message=str(item.get("message", "")),
                title=title.format(part=part or "inventory"),
                short=short.format(part=part or "inventory"),
                fix=fix,
                commands=commands,
            )
        )
    return problems


def problem_kinds(inventory: Any) -> set[tuple[str, str]]:
    """(part, code) of each problem in a stored inventory (messages may vary from report to report)."""
    reported = inventory.get("problems") if isinstance(inventory, dict) else None
    if not isinstance(reported, list):
        return set()
    return {(str(p.get("part", "")), str(p.get("code", ""))) for p in reported if isinstance(p, dict)}
