"""Writes for Ray workloads: training jobs, Tune experiments, Serve deployments. Keyword-only, atomic.

Job state machine (training jobs and Tune experiments, `job_transition` is the only status writer):

    queued  → running | succeeded | failed | cancelled
    running → succeeded | failed | cancelled
    succeeded, failed, cancelled: final

A job waits `queued` (with `queue_reason` and a position) in its Ray cluster's queue while the cluster is
not running, lacks free CPUs/GPUs for it, or it needs more GPUs than the cluster can ever have: by
priority, fair across workspaces, FIFO within (`raymgr.workloads.queue`); events start it (`queue`).
Everything reaches the head as fleet commands to the head's node (`ray.job.submit`, `ray.job.status`, `ray.job.stop`,
`ray.serve.status`); results come back through `workload_on_command_finished` (fleet's
`command_finished` signal). Serve deploys and deletes are short Ray jobs too.

Modules: `jobs` (the job state machine and what training jobs and experiments share), `head` (workload
commands to the head), `training`, `tune`, `serve` (one per aggregate), `results` (command results),
`queue` (the Ray job queue: dispatch on events, queue timeouts), `poll` (the beat pass).
"""

from raymgr.workloads.services.head import IN_FLIGHT, WORKLOAD_COMMANDS
from raymgr.workloads.services.jobs import (
    JOB_TRANSITIONS,
    LOG_LINES,
    RAY_JOB_STATES,
    enqueue_dispatch,
    gpu_capacity,
    job_transition,
)
from raymgr.workloads.services.poll import workloads_poll
from raymgr.workloads.services.queue import queue_expire, ray_queue_dispatch
from raymgr.workloads.services.results import workload_on_command_finished
from raymgr.workloads.services.serve import serve_deployment_create, serve_deployment_stop
from raymgr.workloads.services.training import training_job_cancel, training_job_create
from raymgr.workloads.services.tune import tune_experiment_cancel, tune_experiment_create, tune_train_with_best

__all__ = [
    "IN_FLIGHT",
    "JOB_TRANSITIONS",
    "LOG_LINES",
    "RAY_JOB_STATES",
    "WORKLOAD_COMMANDS",
    "enqueue_dispatch",
    "gpu_capacity",
    "job_transition",
    "queue_expire",
    "ray_queue_dispatch",
    "serve_deployment_create",
    "serve_deployment_stop",
    "training_job_cancel",
    "training_job_create",
    "tune_experiment_cancel",
    "tune_experiment_create",
    "tune_train_with_best",
    "workload_on_command_finished",
    "workloads_poll",
]
