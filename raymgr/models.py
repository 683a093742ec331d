"""Managed Ray: clusters on compute clusters, their head/worker nodes, and their event log."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from fleet.models import Command, ComputeCluster, Node
from kernel.eventlog import EventLogEntry
from tenancy.models import Workspace

# The Ray release the product documents as the default (settings.RAY_VERSIONS starts with it).
DEFAULT_RAY_VERSION = "2.9.0"


def default_ray_version() -> str:
    """The version new clusters get unless one is chosen: the first of settings.RAY_VERSIONS."""
    return (settings.RAY_VERSIONS or [DEFAULT_RAY_VERSION])[0]


class RayClusterStatus(models.TextChoices):
    """Lifecycle of a managed Ray cluster (transitions only through `services.ray_cluster_transition`)."""

    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    FAILED = "failed", "Failed"
    # Stop accepted: its Ray nodes' stop commands are under way (their containers/processes still run).
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    DELETING = "deleting", "Deleting"


class RayRuntime(models.TextChoices):
    """How the agent runs Ray nodes: containers (production), host processes (tests, no Docker), or one
    KubeRay RayCluster (always, on kubernetes and argocd compute clusters)."""

    DOCKER = "docker", "Docker containers"
    PROCESS = "process", "Host processes"
    KUBERAY = "kuberay", "KubeRay RayCluster"


class RayCluster(models.Model):
    """A Ray cluster (one head, autoscaled workers) running on the nodes of one compute cluster."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="ray_clusters")
    compute_cluster = models.ForeignKey(ComputeCluster, on_delete=models.CASCADE, related_name="ray_clusters")
    name = models.CharField(
        max_length=63,
        validators=[
            RegexValidator(
                r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "Use lower-case letters, digits and hyphens (a DNS label)."
            )
        ],
    )
    ray_version = models.CharField(
        max_length=32,
        default=default_ray_version,
        validators=[RegexValidator(r"^[0-9]+\.[0-9]+\.[0-9]+$", "A Ray release such as 2.9.0.")],
    )
    runtime = models.CharField(max_length=16, choices=RayRuntime.choices, default=RayRuntime.DOCKER)
    min_workers = models.PositiveIntegerField(default=0, validators=[MaxValueValidator(1000)])
    max_workers = models.PositiveIntegerField(
        default=10, validators=[MaxValueValidator(1000)], help_text="At most the cluster's nodes minus one."
    )
    idle_timeout_s = models.PositiveIntegerField(default=60, validators=[MinValueValidator(1)])
    # The worker group's pods (kuberay runtime): CPUs, memory and GPUs each worker requests.
    worker_cpus = models.FloatField(default=1.0, validators=[MinValueValidator(0.1), MaxValueValidator(1024)])
    worker_memory_mb = models.PositiveIntegerField(
        default=2048, validators=[MinValueValidator(256), MaxValueValidator(4 * 1024 * 1024)]
    )
    worker_gpus = models.PositiveIntegerField(default=0, validators=[MaxValueValidator(64)])
    checkpoint_on_stop = models.BooleanField(default=False)
    # Docker runtime: its containers run the Ray image carrying vLLM (`vllm_image`), so the ranks of a
    # distributed endpoint on it run inside them (`raymgr.endpoint_groups`).
    serves_vllm = models.BooleanField(
        default=False,
        help_text="Docker runtime: run the Ray image carrying vLLM; a distributed endpoint's ranks run inside it.",
    )
    status = models.CharField(max_length=16, choices=RayClusterStatus.choices, default=RayClusterStatus.PENDING)
    status_changed_at = models.DateTimeField(auto_now_add=True)
    failure_reason = models.TextField(blank=True, default="")
    head_node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    head_hostname = models.CharField(max_length=253, blank=True, default="")
    head_ip = models.CharField(max_length=64, blank=True, default="")
    head_container_id = models.CharField(max_length=128, blank=True, default="")
    # The GCS port asked for; None (the default): the head's node picks a free one at each start.
    gcs_port = models.PositiveIntegerField(
        null=True,
        blank=True,
        default=None,
        validators=[MinValueValidator(1), MaxValueValidator(65535)],
        help_text="Empty: a free port on the head's node, picked at each start.",
    )
    # The GCS port the current head listens on (the one asked for, or the one its node picked).
    head_gcs_port = models.PositiveIntegerField(null=True, blank=True, default=None)
    dashboard_port = models.PositiveIntegerField(
        default=8265, validators=[MinValueValidator(1), MaxValueValidator(65535)]
    )
    # The latest `ray.status` result from the head (nodes, pending demand, log tails) and when it came.
    last_status = models.JSONField(default=dict, blank=True)
    last_status_at = models.DateTimeField(null=True, blank=True)
    # The `last_status_at` the autoscaler last decided on, so one status feeds one decision.
    last_decided_status_at = models.DateTimeField(null=True, blank=True)
    # Why workers wanted (min_workers, the autoscaler) are not being added: the workspace's quota refused
    # them ("" when nothing holds them back); shown on the cluster page.
    quota_block = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="raycluster_unique_workspace_name")]

    def __str__(self) -> str:
        return self.name

    def image(self, *, gpu: bool = False) -> str:
        """The Ray image for this cluster's Ray version (settings.RAY_GPU_IMAGE_TEMPLATE for GPUs)."""
        template = settings.RAY_GPU_IMAGE_TEMPLATE if gpu else settings.RAY_IMAGE_TEMPLATE
        return template.replace("{version}", self.ray_version)

    def vllm_image(self, *, gpu: bool = False) -> str:
        """The Ray image carrying vLLM for this cluster's Ray version, where the ranks of an endpoint served
        across the cluster run (settings.RAY_VLLM_IMAGE_TEMPLATE, RAY_VLLM_GPU_IMAGE_TEMPLATE for GPUs); "" when no vLLM
        release is paired with that version (settings.RAY_VLLM_VERSIONS)."""
        vllm = settings.RAY_VLLM_VERSIONS.get(self.ray_version, "")
        if not vllm:
            return ""
        template = settings.RAY_VLLM_GPU_IMAGE_TEMPLATE if gpu else settings.RAY_VLLM_IMAGE_TEMPLATE
        return template.replace("{version}", self.ray_version).replace("{vllm}", vllm)

    def image_for(self, node: Node) -> str:
        """The Ray image for a Ray node placed on `node` (the -gpu variant on GPU nodes; the one carrying vLLM
        when the cluster serves vLLM)."""
        gpu = bool(node.gpu_count)
        return self.vllm_image(gpu=gpu) if self.serves_vllm else self.image(gpu=gpu)

    @property
    def is_kuberay(self) -> bool:
        """True when the cluster is one KubeRay RayCluster (kubernetes and argocd compute clusters)."""
        return self.runtime == RayRuntime.KUBERAY

    @property
    def kuberay_name(self) -> str:
        """The RayCluster's name: the cluster's name and 8 hex digits of its id (unique per kube cluster)."""
        return f"{self.name[:40].rstrip('-')}-{self.pk.hex[:8]}"

    @property
    def head_service_host(self) -> str:
        """The in-cluster host the agent dials for the head (kuberay: its Service); '' = the head's node."""
        return self.head_hostname if self.is_kuberay else ""

    @property
    def gcs_address(self) -> str:
        """ip:port workers join."""
        return f"{self.head_ip}:{self.head_gcs_port}" if self.head_ip and self.head_gcs_port else ""


class RayNodeRole(models.TextChoices):
    """Head or worker."""

    HEAD = "head", "Head"
    WORKER = "worker", "Worker"


class RayNodeStatus(models.TextChoices):
    """Lifecycle of one Ray node (container or process) of a managed cluster."""

    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    DRAINING = "draining", "Draining"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    FAILED = "failed", "Failed"

    @classmethod
    def live(cls) -> frozenset[str]:
        """States in which the Ray node occupies its fleet node."""
        return frozenset({cls.STARTING, cls.RUNNING, cls.DRAINING, cls.STOPPING})


class RayNode(models.Model):
    """One Ray head or worker of a managed cluster, placed on one fleet node; its latest usage."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    ray_cluster = models.ForeignKey(RayCluster, on_delete=models.CASCADE, related_name="ray_nodes")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="ray_nodes")
    role = models.CharField(max_length=8, choices=RayNodeRole.choices)
    status = models.CharField(max_length=16, choices=RayNodeStatus.choices, default=RayNodeStatus.STARTING)
    status_changed_at = models.DateTimeField(auto_now_add=True)
    failure_reason = models.TextField(blank=True, default="")
    container_id = models.CharField(max_length=128, blank=True, default="")
    ray_node_id = models.CharField(max_length=128, blank=True, default="")
    ip = models.CharField(max_length=64, blank=True, default="")
    cpu_percent = models.FloatField(default=0.0)
    memory_percent = models.FloatField(default=0.0)
    gpu_count = models.PositiveIntegerField(default=0)
    vram_used_mb = models.PositiveBigIntegerField(default=0)
    vram_total_mb = models.PositiveBigIntegerField(default=0)
    running_tasks = models.PositiveIntegerField(default=0)
    idle_s = models.FloatField(default=0.0)
    resources = models.JSONField(default=dict, blank=True)
    available = models.JSONField(default=dict, blank=True)
    # What this Ray node requested when it was admitted against the workspace's quotas (`raymgr.quotas`):
    # CPU cores, memory, GPUs, VRAM, and how many Ray workers it stands for (a KubeRay head: max_workers).
    req_cpus = models.FloatField(default=0.0)
    req_memory_mb = models.PositiveBigIntegerField(default=0)
    req_gpus = models.PositiveIntegerField(default=0)
    req_vram_mb = models.PositiveBigIntegerField(default=0)
    req_workers = models.PositiveIntegerField(default=0)
    start_command = models.ForeignKey(Command, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The drain or stop command in flight for this Ray node (cleared when its result is handled).
    pending_command = models.ForeignKey(Command, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["ray_cluster", "-role", "created_at"]
        indexes = [models.Index(fields=["ray_cluster", "status"], name="raynode_cluster_status")]

    def __str__(self) -> str:
        return f"{self.role} of {self.ray_cluster_id} on {self.node_id} ({self.status})"


class RayClusterEvent(EventLogEntry):
    """One line of a Ray cluster's event log (status changes, placement, autoscaler decisions)."""

    ray_cluster = models.ForeignKey(RayCluster, on_delete=models.CASCADE, related_name="events")

    class Meta(EventLogEntry.Meta):
        indexes = [models.Index(fields=["ray_cluster", "-created_at"], name="rayevent_cluster_created")]


# Django must see every model of the app while it loads `raymgr.models`: the Ray workload models (training
# jobs, Serve deployments, Tune experiments) live in `raymgr.workloads.models` under the same `raymgr` app
# label. Import them from there; nothing is re-exported here.
from raymgr.workloads import models as workload_models  # noqa: E402,F401
