"""Agent error codes → what they mean and what the operator can do (the API's `error_help`, event lines)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorHelp:
    """What an agent error code means and what the operator can do about it."""

    code: str
    title: str
    explanation: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "title": self.title, "explanation": self.explanation, "fix": self.fix}


_HELP: dict[str, tuple[str, str, str]] = {
    "node_deleted": (
        "Node deleted",
        "The node this endpoint ran on was deleted; its agent was told to stop the endpoint's server and left.",
        "Start the endpoint again on another node.",
    ),
    "node_lost": (
        "Node deleted while offline",
        "The node this endpoint ran on was deleted while its agent was offline: the server could not be told "
        "to stop and may still run on that machine.",
        "Stop the server on that machine (or uninstall the agent there), and start the endpoint on another node.",
    ),
    "docker_unavailable": (
        "Docker is not running",
        "The agent could not reach the Docker engine on the node.",
        "Start Docker on the node (`systemctl start docker`) and check that the agent's user may use "
        "/var/run/docker.sock, then retry.",
    ),
    "image_pull_failed": (
        "Image pull failed",
        "The node could not pull the container image (wrong name or tag, or the registry is unreachable).",
        "Check the image name and tag, and that the node can reach the registry; then retry.",
    ),
    "registry_auth_failed": (
        "Registry login failed",
        "The registry refused the credentials given for this image.",
        "Check the registry username and password (or token) and retry.",
    ),
    "kubernetes_unavailable": (
        "Kubernetes API unreachable",
        "The agent could not talk to the Kubernetes API of the node's cluster.",
        "Check the agent's kubeconfig / service account and that the API server is up.",
    ),
    "gitops_failed": (
        "GitOps commit failed",
        "The workload manifest could not be committed to the cluster's Git repository.",
        "Check the repository URL, branch and the deploy credentials of the cluster.",
    ),
    "argocd_sync_failed": (
        "ArgoCD sync failed",
        "ArgoCD did not bring the application to a healthy, synced state.",
        "Open the application in ArgoCD to see which resource failed, fix the manifest and retry.",
    ),
    "kuberay_missing": (
        "KubeRay operator not installed",
        "The compute cluster's Kubernetes has no RayCluster resource (ray.io/v1): the KubeRay operator is missing.",
        "Install the KubeRay operator (https://docs.ray.io/en/latest/cluster/kubernetes/getting-started/"
        "kuberay-operator-installation.html), then start the Ray cluster again.",
    ),
    "hub_unreachable": (
        "Model hub unreachable",
        "The node could not reach the Hugging Face Hub (no network, proxy, or the Hub is down).",
        "Check the node's internet access or HF_ENDPOINT mirror setting, then retry the download.",
    ),
    "model_not_found": (
        "Model not found",
        "The Hub has no model with this id or revision, or it is gated/private for the node's token.",
        "Check the model id (owner/name) and revision; for gated models set a Hub token on the node.",
    ),
    "lora_disabled": (
        "LoRA is off on this endpoint's server",
        "The server was started without --enable-lora, so it cannot load adapters at run time.",
        "Add --enable-lora to the endpoint's server arguments (a rolling update, no downtime), then attach again.",
    ),
    "adapter_missing": (
        "Adapter weights not found",
        "The adapter's folder on the node holds no adapter_config.json, or its repository is not in the cache.",
        "Check the adapter's path on the nodes (an absolute folder in PEFT's format) or its repository and revision.",
    ),
    "adapter_failed": (
        "The server could not load the adapter",
        "vLLM refused the adapter (a rank above --max-lora-rank, more adapters than --max-loras, modules the "
        "model lacks, or weights made for another base model).",
        "Read the message for vLLM's reason; raise --max-lora-rank / --max-loras with a rolling update, or fix "
        "the adapter.",
    ),
    "weights_missing": (
        "Model weights are not yet downloaded",
        "The model is not (fully) downloaded in the node's cache.",
        "Run model.download for this model and revision on the node first, then start the endpoint.",
    ),
    "insufficient_vram": (
        "Insufficient GPU VRAM",
        "The node's GPUs do not have enough free memory (VRAM) for this model.",
        "Stop other GPU workloads on the node, pick a node with more free VRAM, or a smaller model.",
    ),
    "insufficient_cpu": (
        "Insufficient CPU cores",
        "The node has no GPU (vLLM's CPU build) and every one of its cores is held by another endpoint server: "
        "each vLLM CPU server needs a core of its own, or the servers starve each other.",
        "Stop another endpoint on the node, add a node (or a GPU), or pick a node with more cores.",
    ),
    "insufficient_memory": (
        "Insufficient memory",
        "The node (no GPU: vLLM's CPU build) has not enough available memory for this model's weights, "
        "its KV cache and vLLM itself.",
        "Stop other workloads on the node, pick a node with more memory or a GPU, or a smaller model.",
    ),
    "unresponsive": (
        "Server not answering",
        "The endpoint server's process was alive but stopped answering the agent's health checks (GET /health "
        "timed out or failed several times in a row): it hangs, e.g. a stuck GPU, a deadlock or a stopped "
        "process. The replica left rotation, its server was told to stop, and a replacement was started.",
        "Nothing to do if the replacement runs. If replicas keep hanging, read the server's log on the node "
        "(`<state dir>/work/endpoints/endpoint-<id>.log`) and check its GPU (`nvidia-smi`) and memory.",
    ),
    "not_found": (
        "Not found",
        "The node has no such container, endpoint or model.",
        "Refresh the inventory; the object may already have been removed.",
    ),
    "conflict": (
        "Conflict",
        "Something with this name already exists on the node, or it is in a state that forbids this.",
        "Choose another name, or stop/remove the existing object first.",
    ),
    "invalid_payload": (
        "Invalid command",
        "The agent rejected the command's parameters.",
        "Check the values sent; the agent may be older or newer than the control plane.",
    ),
    "unknown_command": (
        "Unknown command",
        "The agent does not know this command type.",
        "Upgrade the agent on the node to the control plane's version.",
    ),
    "unsupported": (
        "Not supported in this mode",
        "The node's orchestration mode cannot run this command.",
        "Use a cluster whose mode supports it (e.g. standalone for local endpoints).",
    ),
    "internal": (
        "Agent error",
        "The agent hit an unexpected error.",
        "Look at the agent's log on the node (`journalctl -u cleverthis-agent`) and retry.",
    ),
    # Control-plane placement refusals (no command was sent).
    "model_not_downloaded": (
        "Model not downloaded",
        "No online node of the cluster has this model and revision in its cache.",
        "Run model.download on a node first, then start the endpoint.",
    ),
    # Set by the control plane's resend beat (`fleet.services.commands_resend_stuck`).
    "undelivered": (
        "Command never acknowledged",
        "The command was sent to the node several times while its tunnel looked connected, and the agent "
        "never acknowledged it.",
        "Check that the node's agent runs and heartbeats (its event log, `journalctl -u cleverthis-agent`), "
        "then send the command again.",
    ),
}


def error_help(code: str | None) -> dict[str, str] | None:
    """The explanation and fix for an error code, or None for an empty code; unknown codes get a generic one."""
    if not code:
        return None
    title, explanation, fix = _HELP.get(
        code,
        (
            f"Error {code}",
            "The node reported an error the control plane has no explanation for.",
            "Read the error message and the agent's log on the node.",
        ),
    )
    return ErrorHelp(code, title, explanation, fix).as_dict()


def error_sentence(code: str, message: str) -> str:
    """One line for the event log: '<title>: <message>. Fix: <fix>'."""
    help_ = error_help(code) or {}
    text = f"{help_.get('title', code)}: {message[:500]}".rstrip()
    return f"{text}. Fix: {help_['fix']}" if help_.get("fix") else text
