"""Workload models: containers on nodes, models cached on nodes, inference endpoints and LoRA adapters (objects of
a workspace, attached to endpoints whose replicas load them at run time: `services.endpoints.adapters`).

Imported (not re-exported) at the end of `fleet/models.py` so Django finds them in the `fleet` app.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from agent import protocol
from fleet import origin_names
from fleet.admission import concurrency_limit
from kernel.eventlog import EventLogEntry

__all__ = [
    "CatalogModel",
    "Container",
    "ContainerStatus",
    "Endpoint",
    "EndpointAdapter",
    "EndpointBenchmark",
    "EndpointEvent",
    "EndpointReplica",
    "EndpointStatus",
    "LoraAdapter",
    "NodeCache",
    "NodeModel",
]


class ContainerStatus(models.TextChoices):
    """Lifecycle of a workload container as the control plane knows it.

    `created`, `running`, `exited`, `stopped`, `missing` are what the agent reports; `pending` (create
    queued, not yet confirmed), `stopping` (stop sent), `failed` (create failed) and `removed`
    (destroyed on our command) are control-plane states.
    """

    PENDING = "pending", "Pending"
    CREATED = "created", "Created"
    RUNNING = "running", "Running"
    STOPPING = "stopping", "Stopping"
    EXITED = "exited", "Exited"
    STOPPED = "stopped", "Stopped"
    MISSING = "missing", "Missing"
    FAILED = "failed", "Failed"
    REMOVED = "removed", "Removed"

    @classmethod
    def active(cls) -> frozenset[str]:
        """States that occupy the node (counted in `Node.containers_count`; a drain moves these)."""
        return frozenset({cls.PENDING, cls.RUNNING, cls.STOPPING})

    @classmethod
    def reported(cls) -> frozenset[str]:
        """States the agent's inventory may report."""
        return frozenset({cls.CREATED, cls.RUNNING, cls.EXITED, cls.STOPPED, cls.MISSING})


class Container(models.Model):
    """A workload container (or Deployment) on one node, kept in step with the agent's inventory."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="containers")
    cluster = models.ForeignKey("fleet.ComputeCluster", on_delete=models.CASCADE, related_name="containers")
    container_id = models.CharField(max_length=128, blank=True, default="")
    name = models.CharField(max_length=128)
    image = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=ContainerStatus.choices, default=ContainerStatus.PENDING)
    spec = models.JSONField(default=dict, blank=True)
    # What its create payload requested (`spec`'s cpu, memory_mb, gpus), summed by the quota check
    # (`fleet.workloads.quotas`); 0 for containers adopted from an inventory.
    req_cpus = models.FloatField(default=0.0)
    req_memory_mb = models.PositiveBigIntegerField(default=0)
    req_gpus = models.PositiveIntegerField(default=0)
    command_key = models.CharField(max_length=64, blank=True, default="")
    created_by_command = models.ForeignKey(
        "fleet.Command", null=True, blank=True, on_delete=models.SET_NULL, related_name="created_containers"
    )
    stop_command = models.ForeignKey(
        "fleet.Command", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    replacement_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replacements"
    )
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node_id", "name", "created_at"]
        indexes = [models.Index(fields=["node", "status"], name="container_node_status")]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "container_id"],
                condition=~models.Q(container_id=""),
                name="container_unique_node_container_id",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} on {self.node_id} ({self.status})"

    @property
    def parsed_spec(self) -> protocol.ContainerCreatePayload | None:
        """The create payload it was made with, as its protocol dataclass (secrets masked as stored); None
        for a container adopted from an inventory (no spec)."""
        return protocol.read_payload("container.create", self.spec)


class NodeModel(models.Model):
    """A model snapshot in one node's cache, as the agent's inventory reports it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="cached_models")
    model_id = models.CharField(max_length=200)
    revision = models.CharField(max_length=200, default="main")
    path = models.CharField(max_length=1000, blank=True, default="")
    size_bytes = models.PositiveBigIntegerField(default=0)
    # When an endpoint last started from it on that node (else when it was downloaded), as the agent reports
    # it (protocol 7 on; None: an older agent): the agent's budget evicts the least recently used first.
    last_used_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model_id", "revision", "node_id"]
        constraints = [
            models.UniqueConstraint(fields=["node", "model_id", "revision"], name="nodemodel_unique_node_model_rev")
        ]

    def __str__(self) -> str:
        return f"{self.model_id}@{self.revision} on {self.node_id}"


class NodeCache(models.Model):
    """A node's model cache as a whole: the disk free under it and its budget as the agent last reported them,
    and the budget an operator set (`budget_mb`, 0: none), sent with each model.download to that node."""

    node = models.OneToOneField("fleet.Node", on_delete=models.CASCADE, primary_key=True, related_name="model_cache")
    disk_free_bytes = models.PositiveBigIntegerField(default=0)
    reported_budget_bytes = models.PositiveBigIntegerField(default=0)
    budget_mb = models.PositiveBigIntegerField(default=0)
    reported_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"model cache of {self.node_id}"


class CatalogModel(models.Model):
    """A model of the catalog: curated (no workspace: imported from `fleet/workloads/catalog.yaml`) or private
    to one workspace (a Hub repository and revision, or a folder on the nodes). Its sizes feed the fit
    computation (`fleet.workloads.catalog`)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(
        "tenancy.Workspace", null=True, blank=True, on_delete=models.CASCADE, related_name="catalog_models"
    )
    name = models.CharField(max_length=100)
    model_id = models.CharField(max_length=200, blank=True, default="")
    revision = models.CharField(max_length=200, default="main")
    local_path = models.CharField(max_length=1000, blank=True, default="")
    description = models.CharField(max_length=500, blank=True, default="")
    params_b = models.FloatField()
    context_length = models.PositiveIntegerField(default=0)
    layers = models.PositiveIntegerField(default=0)
    kv_heads = models.PositiveIntegerField(default=0)
    head_dim = models.PositiveIntegerField(default=0)
    attention_heads = models.PositiveIntegerField(default=0)
    # [{"name": "bf16", "bytes_per_param": 2, "model_id": ""}, ...]: the first is full precision
    quantizations = models.JSONField(default=list, blank=True)
    server_args = models.JSONField(default=list, blank=True)
    tags = models.JSONField(default=list, blank=True)
    catalog_version = models.PositiveIntegerField(default=0)  # the file's version it came from (0: private)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["name"], condition=models.Q(workspace__isnull=True), name="catalogmodel_unique_curated_name"
            ),
            models.UniqueConstraint(fields=["workspace", "name"], name="catalogmodel_unique_workspace_name"),
            models.CheckConstraint(
                condition=~models.Q(model_id="") | ~models.Q(local_path=""), name="catalogmodel_has_a_source"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.model_id or self.local_path})"

    @property
    def curated(self) -> bool:
        """From the repository's catalog file (every workspace sees it; only the file changes it)."""
        return self.workspace_id is None


class EndpointStatus(models.TextChoices):
    """Lifecycle of an inference endpoint."""

    PENDING = "pending", "Pending"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    FAILED = "failed", "Failed"
    # an endpoint only: no replica serves, put to sleep by the idle pass (`services.endpoints.idle`); the
    # next request wakes it (a cold start)
    IDLE = "idle", "Scaled to zero"

    @classmethod
    def live(cls) -> frozenset[str]:
        """States in which the endpoint holds (or is about to hold) resources on its node."""
        return frozenset({cls.PENDING, cls.STARTING, cls.RUNNING, cls.STOPPING})

    @classmethod
    def kept(cls) -> frozenset[str]:
        """States in which an endpoint counts against its workspace's `endpoints` quota: live, or scaled to
        zero (it holds no GPU or VRAM then, but answers on its URL and starts again on the next request)."""
        return cls.live() | {cls.IDLE}


class RoutingPolicy(models.TextChoices):
    """How the proxy picks one of an endpoint's replicas for a request (`fleet.balancer`)."""

    LEAST_LOAD = "least_load", "Least load"
    SESSION = "session", "Session affinity"
    PREFIX = "prefix", "Prompt prefix affinity"


def _new_slug() -> str:
    return uuid.uuid4().hex[:12]


class Endpoint(models.Model):
    """An OpenAI-compatible inference endpoint: a service of `EndpointReplica`s, each a server on a node.

    `status`, `node`, `port` and the failure fields summarise the replicas (written only by
    `fleet.workloads.services.endpoints.replicas.endpoint_summarise`): running while any replica runs,
    `node`/`port` those of the first running (else first live) replica, so single-replica views read on.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.CharField(max_length=12, unique=True, default=_new_slug, editable=False)
    cluster = models.ForeignKey("fleet.ComputeCluster", on_delete=models.CASCADE, related_name="endpoints")
    node = models.ForeignKey("fleet.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="endpoints")
    model_id = models.CharField(max_length=200)
    revision = models.CharField(max_length=200, default="main")
    gpus = models.PositiveIntegerField(default=0)
    min_vram_mb = models.PositiveIntegerField(default=0)
    # The server arguments every replica starts with (`extra_args` of its endpoint.start, after the agent's
    # own flags), validated by `services.endpoints.validation.validate_server_args`; changed by a rolling update.
    server_args = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=16, choices=EndpointStatus.choices, default=EndpointStatus.PENDING)
    port = models.PositiveIntegerField(default=0)
    public = models.BooleanField(default=False)
    # How many replicas the endpoint keeps: `min_replicas`, up to `max_replicas` while its load asks for more
    # (`services.endpoints.autoscale`: per replica, requests per minute against `target_requests_per_min`,
    # requests in flight against `target_in_flight`, completion tokens per second against
    # `target_tokens_per_s`; each 0 = off, all off = no autoscaling; at most one change per `scale_cooldown_s`).
    # With `min_replicas` 0 it scales to zero after `idle_timeout_s` without requests (`services.endpoints.idle`,
    # then status idle from `idle_since`) and the next request starts a replica again (a cold start).
    min_replicas = models.PositiveSmallIntegerField(default=1)
    max_replicas = models.PositiveSmallIntegerField(default=1)
    target_requests_per_min = models.PositiveIntegerField(default=0)
    target_in_flight = models.PositiveIntegerField(default=0)
    target_tokens_per_s = models.PositiveIntegerField(default=0)
    target_queued = models.PositiveIntegerField(default=0)  # requests waiting in its queue, per replica
    scale_cooldown_s = models.PositiveIntegerField(default=120)
    scaled_at = models.DateTimeField(null=True, blank=True)
    idle_timeout_s = models.PositiveIntegerField(default=300)
    idle_since = models.DateTimeField(null=True, blank=True)  # scaled to zero by the idle pass, until woken
    # The autoscaler's last look at `request_count` (its rate is measured between two looks).
    load_sample_count = models.PositiveBigIntegerField(default=0)
    load_sample_at = models.DateTimeField(null=True, blank=True)
    failure_code = models.CharField(max_length=64, blank=True, default="")
    failure_message = models.TextField(blank=True, default="")
    # Requests the proxy forwarded (`fleet.proxy.endpoint_routes`: counted per process, written at most
    # every ENDPOINT_REQUESTS_FLUSH_S per endpoint).
    request_count = models.PositiveBigIntegerField(default=0)
    last_request_at = models.DateTimeField(null=True, blank=True)
    # default limits for each API key invoking this endpoint (None: no limit of the endpoint's own)
    key_requests_per_min = models.PositiveIntegerField(null=True, blank=True)
    key_tokens_per_min = models.PositiveIntegerField(null=True, blank=True)
    # How the proxy spreads requests over the running replicas (`fleet.balancer`; changed without a restart)
    routing_policy = models.CharField(max_length=16, choices=RoutingPolicy.choices, default=RoutingPolicy.LEAST_LOAD)
    # Admission (`fleet.admission`): requests in flight per replica (None: the server's --max-num-seqs, else
    # 256), then a wait queue of at most `queue_max_depth` requests waiting at most `queue_max_wait_s` seconds
    # (None: ENDPOINT_QUEUE_DEPTH / ENDPOINT_QUEUE_WAIT_S); changed without a restart.
    max_concurrency = models.PositiveIntegerField(null=True, blank=True)
    queue_max_depth = models.PositiveIntegerField(null=True, blank=True)
    queue_max_wait_s = models.PositiveIntegerField(null=True, blank=True)
    # A distributed endpoint (`services.endpoints.groups`): one vLLM group across the Ray nodes of a managed Ray
    # cluster, `pipeline_parallel` stages (one per Ray node, the head's node the leader serving the API),
    # `tensor_parallel` GPUs within each (`gpus`). Its replicas are the group's ranks (`EndpointReplica.group_rank`);
    # the group fails, stops and starts as one (`group_failure_code`/`group_failure`: why it last failed, until it
    # starts again; `master_port`: where the followers join the leader). The cluster is named by string: the fleet
    # app never imports raymgr, which answers for its clusters through `fleet.workloads.groups`.
    ray_cluster = models.ForeignKey(
        "raymgr.RayCluster", null=True, blank=True, on_delete=models.SET_NULL, related_name="endpoints"
    )
    pipeline_parallel = models.PositiveSmallIntegerField(default=1)
    tensor_parallel = models.PositiveSmallIntegerField(default=1)
    master_port = models.PositiveIntegerField(default=0)
    group_failure_code = models.CharField(max_length=64, blank=True, default="")
    group_failure = models.TextField(blank=True, default="")
    start_command = models.ForeignKey(
        "fleet.Command", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    stop_command = models.ForeignKey(
        "fleet.Command", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["node", "status"], name="endpoint_node_status")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(max_replicas__gte=1) & models.Q(max_replicas__gte=models.F("min_replicas")),
                name="endpoint_replicas_min_le_max",
            ),
            models.CheckConstraint(
                condition=models.Q(min_replicas__gte=1) | models.Q(idle_timeout_s__gt=0),
                name="endpoint_scale_to_zero_has_idle_timeout",
            ),
        ]

    def __str__(self) -> str:
        return f"endpoint-{self.slug} ({self.model_id}, {self.status})"

    @property
    def distributed(self) -> bool:
        """Whether it runs as one group of ranks across nodes (a Ray cluster's), not as replicas."""
        return self.pipeline_parallel > 1

    @property
    def concurrency_limit(self) -> int:
        """Requests in flight per replica the proxy allows (`max_concurrency`, else --max-num-seqs, else 256)."""
        return concurrency_limit(self.server_args, self.max_concurrency)

    @property
    def queue_depth(self) -> int:
        """Requests that may wait for a slot (the endpoint's own bound, else ENDPOINT_QUEUE_DEPTH)."""
        return settings.ENDPOINT_QUEUE_DEPTH if self.queue_max_depth is None else self.queue_max_depth

    @property
    def queue_wait_s(self) -> float:
        """Seconds a request may wait (the endpoint's own bound, else ENDPOINT_QUEUE_WAIT_S)."""
        return settings.ENDPOINT_QUEUE_WAIT_S if self.queue_max_wait_s is None else float(self.queue_max_wait_s)

    @property
    def cold_start_wait_s(self) -> float:
        """Seconds a request may wait through a cold start: the endpoint's own bound, else the longer of
        ENDPOINT_QUEUE_WAIT_S and ENDPOINT_COLD_START_S (a model load may take minutes)."""
        if self.queue_max_wait_s is not None:
            return float(self.queue_max_wait_s)
        return max(settings.ENDPOINT_QUEUE_WAIT_S, settings.ENDPOINT_COLD_START_S)

    @property
    def hostname(self) -> str:
        """`endpoint-<slug>.<ENDPOINT_DOMAIN>`: the endpoint's own origin."""
        return origin_names.ENDPOINT.host(self.slug)

    @property
    def url(self) -> str:
        """The public URL the control plane's proxy serves this endpoint on."""
        return origin_names.public_url(self.hostname)

    @property
    def proxy_path(self) -> str:
        """The control plane's path for the endpoint: a signed-in member's GET goes on to the endpoint's
        origin through a ticket (`fleet.proxy.endpoint_routes`), so a private endpoint opens in the browser."""
        return f"/endpoints/{self.slug}/"


class ApiKeyEndpoint(models.Model):
    """An endpoint an API key is limited to; a key with no rows may invoke every endpoint of its workspace.

    A deleted endpoint leaves its row (endpoint NULL), so a key limited to it alone stays limited (to none).
    """

    key = models.ForeignKey("tenancy.ApiKey", on_delete=models.CASCADE, related_name="endpoint_grants")
    endpoint = models.ForeignKey(Endpoint, null=True, on_delete=models.SET_NULL, related_name="key_grants")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "endpoint"], name="apikeyendpoint_unique")]

    def __str__(self) -> str:
        return f"key {self.key_id} → endpoint {self.endpoint_id}"


class EndpointReplica(models.Model):
    """One server of an endpoint on one node: what the proxy balances over.

    `server_id` is the `endpoint_id` the agent knows the server by (12 hex digits; the first replica's is
    the endpoint's slug, so an endpoint of one replica looks on the wire as it always did).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="replicas")
    server_id = models.CharField(max_length=12, unique=True, default=_new_slug, editable=False)
    node = models.ForeignKey(
        "fleet.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="endpoint_replicas"
    )
    status = models.CharField(max_length=16, choices=EndpointStatus.choices, default=EndpointStatus.PENDING)
    port = models.PositiveIntegerField(default=0)
    failure_code = models.CharField(max_length=64, blank=True, default="")
    failure_message = models.TextField(blank=True, default="")
    start_command = models.ForeignKey(
        "fleet.Command", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    stop_command = models.ForeignKey(
        "fleet.Command", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The lost replica this one took over from (`services.endpoints.heal`); a replica with a replacement is retired.
    replacement_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replacements"
    )
    # Out of rotation since then (`services.endpoints.replicas.replica_retire`: scaled down or to zero); the healing
    # pass stops it ENDPOINT_DRAIN_S later, so the requests it still serves finish. A new start clears it.
    retired_at = models.DateTimeField(null=True, blank=True)
    # What its server holds on its node, counted by the workspace's quotas while it is live: set as its start is
    # admitted, by the rule the agent pins GPUs by (`agent.protocol.endpoint_gpus_held`: on a GPU node at least
    # one, whatever the endpoint asked) and vLLM's share of their memory (`endpoint_vram_held_mb`).
    held_gpus = models.PositiveIntegerField(default=0)
    held_vram_mb = models.PositiveBigIntegerField(default=0)
    # Of those, what a distributed endpoint's rank runs on that its Ray node already holds and counts against the
    # quotas (`services.endpoints.groups.group_start`, never more than held): the rank is charged only the rest.
    covered_gpus = models.PositiveIntegerField(default=0)
    covered_vram_mb = models.PositiveBigIntegerField(default=0)
    # The LoRA adapters its server has loaded (names), as its start and adapter commands reported them; the proxy
    # sends a request naming an adapter to a replica holding it (`fleet.proxy.endpoint_routes`).
    adapters = models.JSONField(default=list, blank=True)
    # A rank of a distributed endpoint's group (None: an ordinary replica): 0 the leader (serves the API, the only
    # one the proxy routes to), the rest followers; `ray_node` the managed Ray node (its id) whose fleet node runs it.
    group_rank = models.PositiveSmallIntegerField(null=True, blank=True)
    ray_node = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "server_id"]
        indexes = [models.Index(fields=["node", "status"], name="endpoint_replica_node_status")]

    def __str__(self) -> str:
        return f"replica {self.server_id} of endpoint {self.endpoint_id} ({self.status})"

    @property
    def group_role(self) -> str:
        """The rank's role in its group: "leader", "follower", or "" for an ordinary replica."""
        return "" if self.group_rank is None else ("leader" if self.group_rank == 0 else "follower")


class EndpointEvent(EventLogEntry):
    """One line of an endpoint's own event log: its replicas starting, running, failing, replaced, and the
    autoscaler's decisions with the figures behind them (`services.endpoints.events.endpoint_event_record`)."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="events")
    node = models.ForeignKey("fleet.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    command = models.ForeignKey("fleet.Command", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta(EventLogEntry.Meta):
        indexes = [models.Index(fields=["endpoint", "-created_at"], name="endpointevent_endpoint_created")]


class BenchmarkStatus(models.TextChoices):
    """A benchmark's life: queued (its task enqueued), running, then succeeded or failed."""

    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


class EndpointBenchmark(models.Model):
    """One load run through an endpoint's own URL and its stored report (`services.benchmarks`).

    The settings are kept as asked (`concurrency` clients, prompts of about `prompt_tokens` words, `output_tokens`
    tokens asked for, for `duration_s`; `turns` > 1: each client holds conversations of that many turns, each
    resending its history), with the endpoint's revision, server arguments and routing policy at the time, so
    reports of two revisions compare side by side. `report` holds the figures (`fleet.workloads.loadgen.summarise`).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="benchmarks")
    status = models.CharField(max_length=16, choices=BenchmarkStatus.choices, default=BenchmarkStatus.QUEUED)
    concurrency = models.PositiveIntegerField()
    prompt_tokens = models.PositiveIntegerField()
    output_tokens = models.PositiveIntegerField()
    duration_s = models.PositiveIntegerField()
    turns = models.PositiveIntegerField(default=1)
    revision = models.CharField(max_length=200)
    server_args = models.JSONField(default=list, blank=True)
    routing_policy = models.CharField(max_length=16, choices=RoutingPolicy.choices)
    # requests finished so far (written about once a second while it runs: the page's progress)
    requests_done = models.PositiveIntegerField(default=0)
    report = models.JSONField(default=dict, blank=True)
    failure_message = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["endpoint", "-created_at"], name="benchmark_endpoint_created")]

    def __str__(self) -> str:
        return f"benchmark {self.pk} of endpoint {self.endpoint_id} ({self.status})"

    @property
    def in_progress(self) -> bool:
        return self.status in (BenchmarkStatus.QUEUED, BenchmarkStatus.RUNNING)


class LoraAdapter(models.Model):
    """A LoRA adapter of a workspace. `name` is what a request puts in its `model` field to use it; its weights
    are `model_id`@`revision` on the Hub (fetched into a node's model cache when a replica loads it) or, when
    `path` is set, that directory on the nodes."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey("tenancy.Workspace", on_delete=models.CASCADE, related_name="lora_adapters")
    name = models.CharField(max_length=64)
    model_id = models.CharField(max_length=200, blank=True, default="")
    revision = models.CharField(max_length=200, default="main")
    path = models.CharField(max_length=1000, blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="loraadapter_unique_workspace_name"),
            models.CheckConstraint(
                condition=~models.Q(model_id="", path="") & (models.Q(model_id="") | models.Q(path="")),
                name="loraadapter_repository_or_path",
            ),
        ]

    def __str__(self) -> str:
        return f"adapter {self.name} ({self.source})"

    @property
    def source(self) -> str:
        """Where its weights come from, in words."""
        return self.path or f"{self.model_id}@{self.revision}"

    def ref(self) -> protocol.LoraAdapterRef:
        """The adapter as endpoint.start and endpoint.adapter.load carry it."""
        return protocol.LoraAdapterRef(name=self.name, model_id=self.model_id, revision=self.revision, path=self.path)


class EndpointAdapter(models.Model):
    """An adapter attached to an endpoint: every replica of the endpoint loads it (as it starts, or at once
    while it runs) and serves requests naming it."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="adapter_links")
    adapter = models.ForeignKey(LoraAdapter, on_delete=models.CASCADE, related_name="endpoint_links")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]
        constraints = [models.UniqueConstraint(fields=["endpoint", "adapter"], name="endpointadapter_unique")]

    def __str__(self) -> str:
        return f"{self.adapter_id} on endpoint {self.endpoint_id}"
