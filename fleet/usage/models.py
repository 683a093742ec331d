"""Usage rollups: additive counters per time bucket (minute or hour), workspace and subject; the operator's
versioned price table that costs them."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from tenancy.models import Workspace


class Granularity(models.TextChoices):
    """The length of a rollup's bucket."""

    MINUTE = "minute", "Minute"
    HOUR = "hour", "Hour"


class SubjectKind(models.TextChoices):
    """What a rollup counts: an endpoint's requests (per API key), those of them that named one of its LoRA adapters
    (per adapter and API key), or a cluster's node, GPU and container time."""

    ENDPOINT = "endpoint", "Endpoint"
    ADAPTER = "adapter", "LoRA adapter"
    CLUSTER = "cluster", "Cluster"


class UsageRollup(models.Model):
    """The usage of one subject in one bucket; every counter is additive, so buckets sum to any period.

    One row per (granularity, bucket start, workspace, subject, API key): the proxy's flushes add to it
    (`services.usage_add`, one upsert per flush), the minute's sampling sets a cluster's seconds
    (`services.usage_sample`). `subject_id` and `api_key_id` are no foreign keys: the history of an
    endpoint, cluster or key outlives it. `api_key_id` is null for requests made without an API key and
    for cluster rows.
    """

    granularity = models.CharField(max_length=8, choices=Granularity.choices)
    bucket_start = models.DateTimeField()
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, db_constraint=False, related_name="+")
    subject_kind = models.CharField(max_length=16, choices=SubjectKind.choices)
    subject_id = models.UUIDField()
    api_key_id = models.BigIntegerField(null=True, blank=True)
    requests = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0)  # 5xx, no answer, or a response cut short
    rate_limited = models.BigIntegerField(default=0)  # refused 429 by an API key's rate limit (not in requests)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    latency_ms_sum = models.FloatField(default=0.0)  # request to the response's end, summed over `requests`
    latency_ms_max = models.FloatField(default=0.0)
    node_seconds = models.BigIntegerField(default=0)
    gpu_seconds = models.BigIntegerField(default=0)
    container_seconds = models.BigIntegerField(default=0)
    cpu_core_seconds = models.BigIntegerField(default=0)  # the live nodes' CPU cores
    memory_mib_seconds = models.BigIntegerField(default=0)  # the live nodes' memory
    gpu_seconds_by_model = models.JSONField(default=dict, blank=True)  # {"NVIDIA H100": 3600}: gpu_seconds split

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["granularity", "bucket_start", "workspace", "subject_kind", "subject_id", "api_key_id"],
                nulls_distinct=False,
                name="usage_rollup_unique_bucket",
            )
        ]
        indexes = [models.Index(fields=["workspace", "granularity", "bucket_start"], name="usage_workspace_bucket")]

    def __str__(self) -> str:
        return f"{self.subject_kind} {self.subject_id} {self.granularity} {self.bucket_start:%Y-%m-%d %H:%M}"


RATE = {"max_digits": 14, "decimal_places": 6, "default": Decimal(0), "validators": [MinValueValidator(Decimal(0))]}


class PriceVersion(models.Model):
    """One version of the operator's price table, in force from `effective_from` until the next version's.

    Versions are never edited: a change of price is a new version, so a past period is always costed at the
    prices then in force (`fleet.usage.costing`). `effective_from` is on a whole hour (hour rollups are costed
    whole). Per-model GPU prices, per-cluster node prices and per-endpoint token prices override the
    defaults; all prices are per hour, or per million tokens.
    """

    effective_from = models.DateTimeField(unique=True)
    currency = models.CharField(max_length=3, default="USD")
    node_hour = models.DecimalField(**RATE, help_text="Per node-hour (any cluster not priced on its own).")
    cluster_node_hour = models.JSONField(default=dict, blank=True, help_text='{"<cluster id>": "1.50"}')
    gpu_hour = models.DecimalField(**RATE, help_text="Per GPU-hour (any GPU model not priced on its own).")
    gpu_model_hour = models.JSONField(default=dict, blank=True, help_text='{"NVIDIA H100": "2.50"}')
    cpu_core_hour = models.DecimalField(**RATE, help_text="Per CPU core-hour.")
    memory_gib_hour = models.DecimalField(**RATE, help_text="Per GiB-hour of memory.")
    prompt_per_million = models.DecimalField(**RATE, help_text="Per million prompt tokens.")
    completion_per_million = models.DecimalField(**RATE, help_text="Per million completion tokens.")
    endpoint_tokens = models.JSONField(
        default=dict, blank=True, help_text='{"<endpoint id>": {"prompt": "0.5", "completion": "1.5"}} per million'
    )
    note = models.CharField(max_length=200, blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["effective_from"]

    def __str__(self) -> str:
        return f"Prices from {self.effective_from:%Y-%m-%d %H:%M} ({self.currency})"


class BudgetLevel(models.TextChoices):
    """Where a budget's month stands: under 80 %, at 80 % or more, at its limit (100 %) or beyond."""

    OK = "ok", "Under 80 %"
    WARNING = "warning", "80 % reached"
    EXCEEDED = "exceeded", "100 % reached"


class Budget(models.Model):
    """A calendar month's budget (UTC) of a workspace, or of one of its API keys, in tokens and/or money.

    Evaluated at the end of each minute from the usage rollups every web process flushes
    (`services.budgets_evaluate`): at 80 % and 100 % an alert goes to the Usage page's banner, the audit log
    and the Owner's webhook, once a month each; with `hard_stop`, endpoint requests of the workspace (or key)
    are refused 429 from 100 % until the month ends or the limit is raised (`budget_stops`).
    """

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey("tenancy.ApiKey", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    token_limit = models.PositiveBigIntegerField(null=True, blank=True, help_text="Prompt + completion tokens.")
    money_limit = models.DecimalField(
        max_digits=14, decimal_places=2, null=True, blank=True, validators=[MinValueValidator(Decimal(0))]
    )
    hard_stop = models.BooleanField(default=False, help_text="Refuse endpoint requests (429) at 100 %.")
    webhook_url = models.URLField(blank=True, default="", help_text="POSTed a JSON alert at 80 % and 100 %.")
    # the current month's figures, as of the latest evaluation
    month = models.CharField(max_length=7, blank=True, default="")  # "2026-12"
    spent_tokens = models.BigIntegerField(default=0)
    spent_money = models.DecimalField(max_digits=20, decimal_places=6, default=Decimal(0))
    level = models.CharField(max_length=8, choices=BudgetLevel.choices, default=BudgetLevel.OK)
    evaluated_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "api_key"], nulls_distinct=False, name="budget_unique_scope")
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        """How alerts and refusals name it."""
        return (
            f"the monthly budget of API key {self.api_key_id}" if self.api_key_id else "the workspace's monthly budget"
        )

    def shares(self) -> dict[str, float]:
        """The share of each limit used ({"tokens": 0.85, "money": 0.4}), limits set only."""
        out: dict[str, float] = {}
        if self.token_limit is not None:
            out["tokens"] = self.spent_tokens / self.token_limit if self.token_limit else float("inf")
        if self.money_limit is not None:
            out["money"] = float(self.spent_money / self.money_limit) if self.money_limit else float("inf")
        return out
