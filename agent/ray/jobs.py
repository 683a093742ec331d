"""The agent side of Ray workloads: `ray.job.*` and `ray.serve.status` against the head (no Django).

Commands arrive at the head's node; the head's dashboard listens on 127.0.0.1:`dashboard_port` (process
runtime, or a host-network container). Jobs go through `ray.job_submission.JobSubmissionClient`
(its working_dir upload included), the agent's own Ray whatever the cluster's version: the Job REST API it
speaks (`/api/jobs/`, `/api/packages/`) is stable across releases (a 2.60 client drives a 2.9.0 head in
tests/e2e/test_ray_docker_workloads.py). Serve status is read from the dashboard's Serve REST API and replica
logs from its log API. Training jobs, Tune experiments and Serve deploys are all Ray jobs whose scripts
print result markers, lines ``CTFLEET {json}``, which `ray.job.status` returns parsed (`markers`).
"""

from __future__ import annotations

import json
import re
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from agent import protocol
from agent.errors import CommandFailed
from agent.executors.base import ProgressFn

MARKER = "CTFLEET "
MAX_MARKERS = 500
# A marker travels as Result frame → data → "markers" → marker: deeper ones would get the frame refused.
MAX_MARKER_NESTING = protocol.MAX_NESTING - 3
SAFE_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
TRACEBACK_START = "Traceback (most recent call last):"
# What Ray's Job API answers (HTTP 500) while the head's dashboard agent has not registered yet, for a few
# seconds after the head started: worth a retry, unlike any other refusal.
NOT_READY = "try again later"


def parse_markers(logs: str) -> list[dict[str, Any]]:
    """The JSON objects of the ``CTFLEET {...}`` lines in `logs`, in order (the last MAX_MARKERS).

    Markers nested deeper than MAX_MARKER_NESTING are skipped: the result must stay a valid frame.
    """
    found: list[dict[str, Any]] = []
    for line in logs.splitlines():
        index = line.find(MARKER)
        if index < 0:
            continue
        try:
            value = json.loads(line[index + len(MARKER) :])
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict) and not protocol.nesting_exceeds(value, MAX_MARKER_NESTING):
            found.append(value)
    return found[-MAX_MARKERS:]


def extract_traceback(logs: str) -> str:
    """The last Python traceback in `logs` (from 'Traceback' to the exception line), or ''."""
    lines = logs.splitlines()
    start = max((i for i, line in enumerate(lines) if TRACEBACK_START in line), default=-1)
    if start < 0:
        return ""
    end = start + 1
    while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
        end += 1
    return "\n".join(lines[start : end + 1]).strip()


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:]) if lines else ""


class RayJobsHandler:
    """Executes `ray.job.*` / `ray.serve.status`; `work_dir` holds the working dirs of submitted jobs."""

    def __init__(
        self,
        *,
        work_dir: Path | None = None,
        host: str = "127.0.0.1",
        timeout_s: float = 30.0,
        not_ready_retry_s: float = 60.0,
        retry_interval_s: float = 2.0,
    ) -> None:
        self.work_dir = work_dir or Path(tempfile.gettempdir()) / "ctfleet-ray-jobs"
        self.host = host
        self.timeout_s = timeout_s
        self.not_ready_retry_s = not_ready_retry_s  # how long a submit waits for the head's job agent
        self.retry_interval_s = retry_interval_s

    def serve_ports(self) -> set[int]:
        """Serve HTTP ports of the deployments submitted from this node (the control plane may proxy to them)."""
        try:
            return {int(p) for p in json.loads((self.work_dir / "serve-ports.json").read_text())}
        except (OSError, ValueError, TypeError):
            return set()

    def _remember_serve_port(self, files: dict[str, str] | None = None, *, port: Any = None) -> None:
        if files is not None:
            try:
                port = json.loads(files.get("ctfleet_spec.json", "{}")).get("http_port")
            except ValueError:
                return
        if isinstance(port, int) and 0 < port < 65536 and port not in self.serve_ports():
            self.work_dir.mkdir(parents=True, exist_ok=True)
            path = self.work_dir / "serve-ports.json"
            path.write_text(json.dumps(sorted(self.serve_ports() | {port})))

    def handles(self, command_type: str) -> bool:
        """True for the workload command types."""
        return command_type in protocol.RAY_JOB_COMMAND_TYPES

    def run(self, command_type: str, payload: Any, progress: ProgressFn) -> Any:
        """Run one command; returns its result type (`agent.protocol.results`) or raises `CommandFailed`."""
        if not self.handles(command_type):
            raise CommandFailed("unknown_command", f"{command_type} is not a Ray workload command")
        if isinstance(payload, dict):
            try:
                payload = protocol.parse_payload(command_type, payload)
            except protocol.ProtocolError as exc:
                raise CommandFailed("invalid_payload", str(exc)) from None
        try:
            return self.ROUTES[command_type](self, payload, progress)
        except CommandFailed:
            raise
        except (ConnectionError, urllib.error.URLError, TimeoutError) as exc:
            raise CommandFailed("not_found", f"the Ray dashboard does not answer: {exc}") from None
        except Exception as exc:  # Ray's client raises RuntimeError/ValueError with the dashboard's message
            text = str(exc)
            code = "not_found" if "does not exist" in text or "not found" in text.lower() else "internal"
            raise CommandFailed(code, f"{type(exc).__name__}: {text[-2000:]}") from None

    def _address(self, port: int, host: str = "") -> str:
        """The head's dashboard: `host` (a KubeRay head's Service) or this node's `self.host`."""
        return f"http://{host or self.host}:{port}"

    def _client(self, port: int, host: str = "") -> Any:
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError:
            raise CommandFailed("unsupported", "Ray is not installed next to this agent") from None
        try:
            return JobSubmissionClient(self._address(port, host))
        except ConnectionError as exc:
            raise CommandFailed("not_found", f"no Ray dashboard at {self._address(port, host)}: {exc}") from None

    # ---- jobs

    def _job_submit(self, p: protocol.RayJobSubmitPayload, progress: ProgressFn) -> protocol.RayJobSubmitResult:
        client = self._client(p.dashboard_port, p.host)
        try:
            info = client.get_job_info(p.submission_id)
        except Exception:
            info = None
        if info is not None:
            return protocol.RayJobSubmitResult(
                submission_id=p.submission_id, status=str(info.status.value), already_submitted=True
            )
        runtime_env = dict(p.runtime_env)
        if p.submission_id.startswith("serve-"):
            self._remember_serve_port(p.files)
        if p.files:
            job_dir = self.work_dir / p.submission_id
            job_dir.mkdir(parents=True, exist_ok=True)
            for name, content in p.files.items():
                if not SAFE_FILE.match(name):
                    raise CommandFailed("invalid_payload", f"bad file name {name!r}")
                (job_dir / name).write_text(content)
            runtime_env["working_dir"] = str(job_dir)
        progress(f"submitting Ray job {p.submission_id}")
        kwargs: dict[str, Any] = {}
        if p.entrypoint_num_cpus:
            kwargs["entrypoint_num_cpus"] = p.entrypoint_num_cpus
        if p.entrypoint_num_gpus:
            kwargs["entrypoint_num_gpus"] = p.entrypoint_num_gpus
        deadline = time.monotonic() + self.not_ready_retry_s
        while True:
            try:
                submission_id = client.submit_job(
                    entrypoint=p.entrypoint,
                    submission_id=p.submission_id,
                    runtime_env=runtime_env or None,
                    metadata=dict(p.metadata) or None,
                    **kwargs,
                )
                break
            except RuntimeError as exc:
                if NOT_READY not in str(exc) or time.monotonic() >= deadline:
                    raise
                progress("the Ray head's job agent is not ready yet; retrying")
                time.sleep(self.retry_interval_s)
        return protocol.RayJobSubmitResult(submission_id=submission_id, status="PENDING", already_submitted=False)

    def _job_status(self, p: protocol.RayJobRefPayload, progress: ProgressFn) -> protocol.RayJobStatusResult:
        client = self._client(p.dashboard_port, p.host)
        try:
            info = client.get_job_info(p.submission_id)
        except RuntimeError as exc:
            raise CommandFailed("not_found", f"no Ray job {p.submission_id}: {exc}") from None
        logs = client.get_job_logs(p.submission_id) or ""
        status = str(info.status.value)
        return protocol.RayJobStatusResult(
            submission_id=p.submission_id,
            status=status,
            message=info.message or "",
            logs=_tail(logs, p.log_lines),
            traceback=extract_traceback(logs) if status == "FAILED" else "",
            markers=parse_markers(logs),
            start_time=info.start_time,
            end_time=info.end_time,
        )

    def _job_stop(self, p: protocol.RayJobRefPayload, progress: ProgressFn) -> protocol.RayJobStopResult:
        client = self._client(p.dashboard_port, p.host)
        progress(f"stopping Ray job {p.submission_id}")
        try:
            stopped = client.stop_job(p.submission_id)
        except RuntimeError as exc:
            raise CommandFailed("not_found", f"no Ray job {p.submission_id}: {exc}") from None
        return protocol.RayJobStopResult(submission_id=p.submission_id, stopped=bool(stopped))

    # ---- serve

    def _get_json(self, port: int, path: str, host: str = "") -> Any:
        with urllib.request.urlopen(self._address(port, host) + path, timeout=self.timeout_s) as response:
            return json.loads(response.read() or b"null")

    def _serve_status(self, p: protocol.RayServeStatusPayload, progress: ProgressFn) -> protocol.RayServeStatusResult:
        try:
            details = self._get_json(p.dashboard_port, "/api/serve/applications/", p.host)
        except urllib.error.HTTPError as exc:
            raise CommandFailed("internal", f"Serve status failed: HTTP {exc.code}") from None
        details = details if isinstance(details, dict) else {}
        apps = details.get("applications") or {}
        wanted = {p.app_name: apps[p.app_name]} if p.app_name and p.app_name in apps else ({} if p.app_name else apps)
        result_apps: dict[str, Any] = {}
        for name, app in wanted.items():
            deployments = {}
            for dep_name, dep in (app.get("deployments") or {}).items():
                replicas = [
                    {
                        "replica_id": r.get("replica_id", ""),
                        "state": r.get("state", ""),
                        "node_id": r.get("node_id", ""),
                        "log_file_path": r.get("log_file_path", ""),
                    }
                    for r in dep.get("replicas") or []
                ]
                deployments[dep_name] = {
                    "status": dep.get("status", ""),
                    "message": dep.get("message", ""),
                    "target_num_replicas": (dep.get("target_num_replicas")),
                    "replicas": replicas,
                }
            result_apps[name] = {
                "status": app.get("status", ""),
                "message": app.get("message", ""),
                "route_prefix": app.get("route_prefix"),
                "deployments": deployments,
                "replica_logs": self._replica_logs(p, deployments),
            }
        http = details.get("http_options") or {}
        if result_apps:
            self._remember_serve_port(port=http.get("port"))  # the port Serve really listens on
        return protocol.RayServeStatusResult(
            applications=result_apps,
            http_port=http.get("port"),
            http_host=http.get("host"),
            missing=bool(p.app_name and p.app_name not in apps),
        )

    def _replica_logs(self, p: protocol.RayServeStatusPayload, deployments: dict[str, Any]) -> dict[str, str]:
        if not p.log_lines:
            return {}
        logs: dict[str, str] = {}
        for dep in deployments.values():
            for replica in dep["replicas"][:8]:
                path, node_id = replica["log_file_path"], replica["node_id"]
                if not path or not node_id:
                    continue
                query = urllib.parse.urlencode({"node_id": node_id, "filename": path.lstrip("/"), "lines": p.log_lines})
                try:
                    with urllib.request.urlopen(
                        f"{self._address(p.dashboard_port, p.host)}/api/v0/logs/file?{query}", timeout=self.timeout_s
                    ) as response:
                        text = response.read().decode("utf-8", "replace")
                except (urllib.error.URLError, TimeoutError) as exc:
                    text = f"(log unavailable: {exc})"
                logs[replica["replica_id"]] = _tail(text, p.log_lines)
        return logs

    # Which method runs each command type (every one of `protocol.RAY_JOB_COMMAND_TYPES`).
    ROUTES: ClassVar[dict[str, Callable[..., Any]]] = {
        "ray.job.submit": _job_submit,
        "ray.job.status": _job_status,
        "ray.job.stop": _job_stop,
        "ray.serve.status": _serve_status,
    }
