"""Results of workload commands (`workload_on_command_finished`, on fleet's `command_finished`): job and
Serve status recorded on their rows."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from agent import protocol
from fleet.models import Command, CommandStatus
from raymgr.workloads import health
from raymgr.workloads.models import ServeDeployment, ServeStatus, TrainingJob, TuneExperiment, TuneTrial
from raymgr.workloads.services.head import WORKLOAD_COMMANDS
from raymgr.workloads.services.jobs import JOB_TRANSITIONS, RAY_JOB_STATES, J, job_transition


def workload_on_command_finished(*, command: Command) -> None:
    """Fleet `command_finished` hook: record workload command results on their rows."""
    if command.command_type not in WORKLOAD_COMMANDS or command.status not in CommandStatus.terminal():
        return
    ok = command.status == CommandStatus.SUCCEEDED
    payload = command.parsed_payload  # the command type's protocol dataclass
    if payload is None:
        return
    result = command.parsed_result  # the command type's typed result when it succeeded, else None
    with transaction.atomic():
        if command.command_type == "ray.serve.status":
            deployment = (
                ServeDeployment.objects.select_for_update()
                .select_related("ray_cluster")
                .filter(ray_cluster_id=payload.cluster_id, name=payload.app_name[4:])
                .first()
            )
            if deployment is not None and ok:
                _record_serve_status(deployment, result)
            return
        submission_id = payload.submission_id
        row = _row_for(submission_id)
        if row is None:
            return
        if isinstance(row, ServeDeployment):
            if command.command_type == "ray.job.status" and ok and row.submission_id == submission_id:
                _record_serve_job(row, result)
            elif command.command_type == "ray.job.submit" and not ok:
                ServeDeployment.objects.filter(pk=row.pk).update(
                    status=ServeStatus.FAILED, status_changed_at=timezone.now(), failure_reason=_error(command)
                )
            return
        if command.command_type == "ray.job.submit" and not ok and row.status in J.active():
            job_transition(row, J.FAILED, failure_reason=f"Submission to Ray failed: {_error(command)}")
        elif command.command_type == "ray.job.status" and ok:
            _record_job_status(row, result, command.result or {})
        elif (
            command.command_type == "ray.job.status" and command.error_code == "not_found" and row.status in J.active()
        ):
            job_transition(row, J.FAILED, failure_reason=f"Ray no longer knows this job: {_error(command)}")


def _error(command: Command) -> str:
    return f"{command.error_code}: {command.error_message}" if command.error_code else command.error_message


def _row_for(submission_id: str) -> TrainingJob | TuneExperiment | ServeDeployment | None:
    prefix, _, rest = submission_id.partition("-")
    key = rest[:36]
    model: Any = {"train": TrainingJob, "tune": TuneExperiment, "serve": ServeDeployment}.get(prefix)
    if model is None:
        return None
    try:
        return model.objects.select_for_update().select_related("ray_cluster", "workspace").filter(pk=key).first()
    except ValidationError:
        return None


def _record_job_status(
    row: TrainingJob | TuneExperiment, result: protocol.RayJobStatusResult, raw: dict[str, Any]
) -> None:
    """Store a `ray.job.status` result on a training job / experiment and move its state (`raw`, the
    result as the agent sent it, is kept as the row's last status, less logs and markers)."""
    ray_state = result.status
    fields: dict[str, Any] = {
        "last_status": {k: v for k, v in raw.items() if k not in ("logs", "markers")},
        "last_status_at": timezone.now(),
        "logs": result.logs[-200_000:],
    }
    if result.traceback:
        fields["traceback"] = result.traceback[-50_000:]
    markers = result.markers
    if isinstance(row, TrainingJob):
        checkpoints = [
            {"path": str(m.get("path", "")), "metrics": m.get("metrics") or {}}
            for m in markers
            if m.get("kind") == "checkpoint" and m.get("path")
        ]
        if checkpoints:
            fields["checkpoints"] = checkpoints
    else:
        _record_trials(row, markers)
        best = next((m for m in reversed(markers) if m.get("kind") == "best"), None)
        if best is not None:
            fields["best_config"] = best.get("config") or {}
            fields["best_result"] = best.get("metrics") or {}
    if ray_state == "STOPPED":
        target = J.CANCELLED
    else:
        target = RAY_JOB_STATES.get(ray_state, row.status)
    if target == J.FAILED and not fields.get("failure_reason"):
        fields["failure_reason"] = result.message[:2000]
    if target == J.QUEUED and row.status == J.QUEUED:
        fields["queue_reason"] = "Ray has the job pending: " + (result.message or "waiting for resources")
    if row.status in J.active() and target != row.status and target in JOB_TRANSITIONS[row.status]:
        job_transition(row, target, **fields)
    else:
        type(row).objects.filter(pk=row.pk).update(**fields)
        for name, value in fields.items():
            setattr(row, name, value)


def _record_trials(experiment: TuneExperiment, markers: list[dict[str, Any]]) -> None:
    latest: dict[str, dict[str, Any]] = {}
    for marker in markers:
        if marker.get("kind") != "trial" or not marker.get("trial_id"):
            continue
        entry = latest.setdefault(str(marker["trial_id"])[:100], {"status": "PENDING", "config": {}})
        entry["status"] = str(marker.get("status", entry["status"]))[:16]
        entry["config"] = marker.get("config") or entry["config"]
        if "iteration" in marker:
            entry["iterations"] = int(marker.get("iteration") or 0)
            entry["metric_value"] = marker.get("metric")
            entry["last_result"] = marker.get("result") or {}
    for trial_id, entry in latest.items():
        TuneTrial.objects.update_or_create(experiment=experiment, trial_id=trial_id, defaults=entry)


def _record_serve_job(deployment: ServeDeployment, result: protocol.RayJobStatusResult) -> None:
    """A deploy/delete job's status: failures (with traceback) are shown; success hands over to Serve status."""
    state = result.status
    fields: dict[str, Any] = {"last_status_at": timezone.now()}
    if state == "FAILED" or state == "STOPPED":
        reason = result.traceback or result.message or "the deploy job failed"
        fields.update(status=ServeStatus.FAILED, failure_reason=reason[-20_000:])
    elif state == "SUCCEEDED" and deployment.status == ServeStatus.STOPPING:
        fields.update(status=ServeStatus.STOPPED, endpoint_url="")
    if "status" in fields:
        fields["status_changed_at"] = timezone.now()
    ServeDeployment.objects.filter(pk=deployment.pk).update(**fields)


def _record_serve_status(deployment: ServeDeployment, result: protocol.RayServeStatusResult) -> None:
    app = result.applications.get(deployment.app_name)
    status, reason = health.serve_health(app, deploying=deployment.status == ServeStatus.DEPLOYING)
    fields: dict[str, Any] = {
        "last_status": {
            **{k: v for k, v in (app or {}).items() if k != "replica_logs"},
            "http_port": result.http_port,
        },
        "last_status_at": timezone.now(),
    }
    if app:
        fields["replica_logs"] = app.get("replica_logs") or {}
    if deployment.status not in (ServeStatus.STOPPING, ServeStatus.STOPPED, ServeStatus.FAILED):
        fields["failure_reason"] = reason
        if status != deployment.status:
            fields.update(status=status, status_changed_at=timezone.now())
        port = result.http_port or deployment.http_port
        cluster = deployment.ray_cluster
        if status in (ServeStatus.RUNNING, ServeStatus.DEGRADED) and cluster.head_ip:
            fields["endpoint_url"] = f"http://{cluster.head_ip}:{port}{deployment.route_prefix}"
    ServeDeployment.objects.filter(pk=deployment.pk).update(**fields)
