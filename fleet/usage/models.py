"""Usage rollups: additive counters per time bucket (minute or hour), workspace and subject."""

from __future__ import annotations

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
