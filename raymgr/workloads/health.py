"""Pure functions: Serve health from a status report, and troubleshooting hints with their likely cause."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

STUCK_PENDING_AFTER = dt.timedelta(minutes=5)
FAILED_IMMEDIATELY_WITHIN = dt.timedelta(seconds=60)
OBJECT_STORE_HIGH = 0.8


def serve_health(app: dict[str, Any] | None, *, deploying: bool = False) -> tuple[str, str]:
    """(status, reason) of one Serve application from `ray.serve.status`.

    running: the app runs and every replica is up; degraded: it runs but some deployment is unhealthy
    or below its replica target; unhealthy: the app failed to deploy or is unhealthy (or is gone).
    """
    if not app:
        return ("deploying", "") if deploying else ("unhealthy", "The application is not on the cluster.")
    status = str(app.get("status", "")).upper()
    message = str(app.get("message", ""))
    if status in ("DEPLOY_FAILED", "UNHEALTHY"):
        return "unhealthy", message or f"Serve reports {status}."
    if status in ("DEPLOYING", "NOT_STARTED"):
        return "deploying", ""
    if status == "DELETING":
        return "stopping", ""
    problems = []
    for name, dep in (app.get("deployments") or {}).items():
        replicas = dep.get("replicas") or []
        up = sum(1 for r in replicas if r.get("state") == "RUNNING")
        target = dep.get("target_num_replicas")
        if str(dep.get("status", "")).upper() == "UNHEALTHY":
            problems.append(f"{name} is unhealthy: {dep.get('message', '')}".strip(": "))
        elif isinstance(target, int) and up < target:
            problems.append(f"{name} has {up} of {target} replicas running")
    if problems:
        return "degraded", "; ".join(problems)
    return "running", ""


@dataclass(frozen=True)
class Hint:
    """One troubleshooting finding: what is wrong and its likely cause."""

    problem: str
    cause: str
    severity: str = "warning"


def _resources_text(resources: dict[str, Any]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(resources.items()) if isinstance(v, int | float)) or "nothing"


def job_hints(
    *,
    status: str,
    queue_reason: str = "",
    submitted_at: dt.datetime | None,
    created_at: dt.datetime,
    finished_at: dt.datetime | None,
    traceback: str,
    failure_reason: str = "",
    cluster_status: dict[str, Any] | None,
    now: dt.datetime,
) -> list[Hint]:
    """Hints for a training job or Tune experiment: stuck pending, failing immediately."""
    hints: list[Hint] = []
    if status == "queued" and now - (submitted_at or created_at) >= STUCK_PENDING_AFTER:
        pending = (cluster_status or {}).get("pending") or []
        if queue_reason and submitted_at is None:
            cause = queue_reason
        elif pending:
            cause = (
                f"Ray cannot place {len(pending)} resource request(s) (e.g. {_resources_text(pending[0])}): "
                "no node has that much free, and the autoscaler has not added one (check max_workers and "
                "the resources per worker)."
            )
        else:
            cause = (
                queue_reason or "The head has not started the job: check the cluster is running and the head's logs."
            )
        hints.append(Hint("Stuck pending", cause))
    if status == "failed" and submitted_at and finished_at and finished_at - submitted_at <= FAILED_IMMEDIATELY_WITHIN:
        last = (traceback.strip().splitlines() or [failure_reason or "no traceback"])[-1]
        if "ModuleNotFoundError" in last or "ImportError" in last:
            cause = f"A package is missing on the cluster ({last}); add it to the image or the runtime_env."
        elif "SyntaxError" in traceback:
            cause = f"The script does not parse ({last})."
        elif "FileNotFoundError" in last:
            cause = f"A file the script needs is not on the cluster ({last})."
        else:
            cause = f"The script raised at start-up: {last}"
        hints.append(Hint("Job failed immediately", cause, "error"))
    return hints


def row_job_hints(row: Any, *, now: dt.datetime) -> list[Hint]:
    """`job_hints` for a training job or Tune experiment row (reads its fields, nothing else)."""
    return job_hints(
        status=row.status,
        queue_reason=getattr(row, "queue_reason", "") or row.failure_reason,
        submitted_at=row.submitted_at,
        created_at=row.created_at,
        finished_at=row.finished_at,
        traceback=row.traceback,
        failure_reason=row.failure_reason,
        cluster_status=row.ray_cluster.last_status,
        now=now,
    )


def cluster_hints(*, cluster_status: dict[str, Any] | None, live_workers: int, max_workers: int) -> list[Hint]:
    """Hints from a Ray cluster's latest status: workers not scaling, high object-store memory."""
    status = cluster_status or {}
    hints: list[Hint] = []
    pending = status.get("pending") or []
    if pending:
        if live_workers >= max_workers:
            cause = (
                f"The cluster is at max_workers ({max_workers}) with {len(pending)} request(s) waiting: "
                "raise max_workers or lower the resources asked per worker/trial."
            )
        else:
            cause = (
                f"{len(pending)} request(s) (e.g. {_resources_text(pending[0])}) wait but no worker was added: "
                "no free compute node is large enough for them, or a worker failed to start (see Events)."
            )
        hints.append(Hint("Workers not scaling", cause))
    for node in status.get("nodes") or []:
        total = (node.get("resources") or {}).get("object_store_memory")
        free = (node.get("available") or {}).get("object_store_memory")
        if isinstance(total, int | float) and isinstance(free, int | float) and total > 0:
            used = 1 - free / total
            if used >= OBJECT_STORE_HIGH:
                who = "head" if node.get("is_head") else f"node {str(node.get('ray_node_id', ''))[:8]}"
                hints.append(
                    Hint(
                        "High object store memory",
                        f"The {who} object store is {used:.0%} full: large objects are kept alive by references "
                        "(ray.get results held, big arguments passed by value) and will spill to disk; release "
                        "references or pass data with ray.put once.",
                    )
                )
    return hints
