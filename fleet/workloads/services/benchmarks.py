"""Benchmarks of an endpoint: a load through its own URL, run by a Celery worker, and the stored report.

`benchmark_create` (Owner/Admin, audited) checks the settings, stores the run (queued) with the endpoint's
revision, server arguments and routing policy, and enqueues `benchmark_run` on commit; one run at a time per
endpoint. `benchmark_run` (the task's body) claims it, makes a short-lived API key for it (scope `invoke`,
limited to this endpoint, owned by whoever asked, expiring soon after the run's planned end; revoked when the
run ends), sends the load with `fleet.workloads.loadgen` to BENCHMARK_TARGET_URL (the web processes as the
workers reach them; the request's Host is the endpoint's origin, so it takes the path any client's does: key
check, limits, routing, tunnel) and stores the report; `requests_done` moves about once a second meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from audit.services import on, operator_action
from fleet import enqueue
from fleet.workloads import loadgen
from fleet.workloads.models import ApiKeyEndpoint, BenchmarkStatus, Endpoint, EndpointBenchmark, EndpointStatus
from kernel.exceptions import IllegalTransition
from tenancy import api_keys
from tenancy.mixins import require_operator
from tenancy.models import ApiKey, ApiKeyScope

logger = logging.getLogger(__name__)

BENCHMARK_TASK = "fleet.workloads.tasks.endpoint_benchmark_run"
# field → (least, most) accepted
LIMITS: dict[str, tuple[int, int]] = {
    "concurrency": (1, 256),
    "prompt_tokens": (1, 32_000),
    "output_tokens": (1, 8_192),
    "duration_s": (1, 1_800),
    "turns": (1, 50),
}
KEY_MARGIN = timedelta(minutes=15)  # the run's key outlives its planned end by this much at most
BENCHMARKABLE = frozenset({EndpointStatus.RUNNING, EndpointStatus.IDLE})


def validate_settings(values: dict[str, Any]) -> dict[str, int]:
    """The run's settings as integers within LIMITS; ValidationError with a message per bad field."""
    errors: dict[str, str] = {}
    clean: dict[str, int] = {}
    for name, (least, most) in LIMITS.items():
        value = values.get(name, 1 if name == "turns" else None)
        if isinstance(value, bool) or not isinstance(value, int):
            errors[name] = f"A whole number from {least} to {most}."
        elif not least <= value <= most:
            errors[name] = f"Must be from {least} to {most}."
        else:
            clean[name] = value
    if errors:
        raise ValidationError(errors)
    return clean


@operator_action(
    "endpoint.benchmark",
    target=on("endpoint", "endpoint"),
    detail=lambda kw, _: {name: kw.get(name) for name in LIMITS},
)
def benchmark_create(
    *,
    actor: AbstractBaseUser,
    endpoint: Endpoint,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    duration_s: int,
    turns: int = 1,
) -> EndpointBenchmark:
    """Queue a benchmark of `endpoint` (Owner/Admin; 400 for bad settings; 409 unless the endpoint is running or
    scaled to zero, or while another benchmark of it runs)."""
    require_operator(actor, endpoint.cluster.workspace, what="benchmark endpoints")
    values = validate_settings(
        {
            "concurrency": concurrency,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "duration_s": duration_s,
            "turns": turns,
        }
    )
    endpoint = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
    _fail_lost(endpoint)
    if endpoint.status not in BENCHMARKABLE:
        raise IllegalTransition(
            f"Only a running endpoint (or one scaled to zero) can be benchmarked; this one is {endpoint.status}."
        )
    if EndpointBenchmark.objects.filter(
        endpoint=endpoint, status__in=[BenchmarkStatus.QUEUED, BenchmarkStatus.RUNNING]
    ).exists():
        raise IllegalTransition("A benchmark of this endpoint is under way; wait for its report.")
    benchmark = EndpointBenchmark.objects.create(
        endpoint=endpoint,
        revision=endpoint.revision,
        server_args=endpoint.server_args,
        routing_policy=endpoint.routing_policy,
        created_by=actor,
        **values,
    )
    enqueue.on_commit(BENCHMARK_TASK, str(benchmark.pk))
    return benchmark


def _fail_lost(endpoint: Endpoint) -> None:
    """Fail this endpoint's runs that cannot be under way any more: queued or running for longer than their
    duration and KEY_MARGIN (the worker that held one was lost, or no worker took it), so they block no new run."""
    now = timezone.now()
    for run in EndpointBenchmark.objects.filter(
        endpoint=endpoint, status__in=[BenchmarkStatus.QUEUED, BenchmarkStatus.RUNNING]
    ):
        if (run.started_at or run.created_at) + timedelta(seconds=run.duration_s) + KEY_MARGIN < now:
            EndpointBenchmark.objects.filter(pk=run.pk, status=run.status).update(
                status=BenchmarkStatus.FAILED,
                finished_at=now,
                failure_message="No report came: the worker running it was lost (or none took it).",
            )


def _key_for(benchmark: EndpointBenchmark) -> tuple[ApiKey, str]:
    """A key for this run alone: invoke scope, this endpoint only, expiring soon after the run's planned end."""
    raw, prefix = api_keys.new_key()
    key = ApiKey.objects.create(
        user=benchmark.created_by,
        workspace=benchmark.endpoint.cluster.workspace,
        name=f"benchmark {str(benchmark.pk)[:8]} (revoked when it ends)",
        prefix=prefix,
        secret_hash=api_keys.hash_key(raw),
        scopes=[ApiKeyScope.INVOKE],
        expires_at=timezone.now() + timedelta(seconds=benchmark.duration_s) + KEY_MARGIN,
    )
    ApiKeyEndpoint.objects.create(key=key, endpoint=benchmark.endpoint)
    return key, raw


def benchmark_run(*, benchmark_id: Any) -> EndpointBenchmark | None:
    """Run a queued benchmark to its end (the task's body; None when it is gone or already claimed)."""
    if not EndpointBenchmark.objects.filter(pk=benchmark_id, status=BenchmarkStatus.QUEUED).update(
        status=BenchmarkStatus.RUNNING, started_at=timezone.now()
    ):
        return None
    benchmark = EndpointBenchmark.objects.select_related("endpoint__cluster__workspace").get(pk=benchmark_id)
    if benchmark.created_by_id is None:
        return _finish(benchmark, failure="Whoever asked for this benchmark no longer exists.")
    key, raw = _key_for(benchmark)
    endpoint = benchmark.endpoint
    spec = loadgen.LoadSpec(
        model=endpoint.model_id,
        concurrency=benchmark.concurrency,
        prompt_tokens=benchmark.prompt_tokens,
        output_tokens=benchmark.output_tokens,
        duration_s=benchmark.duration_s,
        turns=benchmark.turns,
        seed=benchmark.pk.int % 2**31,
    )
    headers = {"Authorization": f"Bearer {raw}", "Host": endpoint.hostname}

    def progress(done: int) -> None:
        EndpointBenchmark.objects.filter(pk=benchmark.pk).update(requests_done=done)

    async def load() -> tuple[list[loadgen.Outcome], float]:
        from asgiref.sync import sync_to_async

        async_progress = sync_to_async(progress, thread_sensitive=False)
        pending: set[asyncio.Task] = set()

        def on_progress(done: int) -> None:
            task = asyncio.ensure_future(async_progress(done))
            pending.add(task)
            task.add_done_callback(pending.discard)

        outcomes, elapsed = await loadgen.run(settings.BENCHMARK_TARGET_URL, headers, spec, on_progress=on_progress)
        await asyncio.gather(*pending, return_exceptions=True)
        return outcomes, elapsed

    try:
        outcomes, elapsed = asyncio.run(load())
    except Exception as exc:  # the run failed as a whole: say why on its page
        logger.exception("benchmark %s failed", benchmark.pk)
        return _finish(benchmark, failure=f"{type(exc).__name__}: {exc}", key=key)
    report = loadgen.summarise(outcomes, elapsed)
    if not report["succeeded"]:
        kinds = ", ".join(f"{k}: {n}" for k, n in report["errors_by_kind"].items()) or "no request was sent"
        return _finish(benchmark, report=report, failure=f"No request succeeded ({kinds}).", key=key)
    return _finish(benchmark, report=report, key=key)


def _finish(
    benchmark: EndpointBenchmark, *, report: dict | None = None, failure: str = "", key: ApiKey | None = None
) -> EndpointBenchmark:
    with transaction.atomic():
        if key is not None:
            ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
        benchmark.report = report or {}
        benchmark.failure_message = failure
        benchmark.status = BenchmarkStatus.FAILED if failure else BenchmarkStatus.SUCCEEDED
        benchmark.requests_done = (report or {}).get("requests", benchmark.requests_done)
        benchmark.finished_at = timezone.now()
        benchmark.save(update_fields=["report", "failure_message", "status", "requests_done", "finished_at"])
    api_keys.forget_grants()
    return benchmark


__all__ = ["BENCHMARK_TASK", "LIMITS", "benchmark_create", "benchmark_run", "validate_settings"]
