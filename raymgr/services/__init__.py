"""Writes for managed Ray clusters. Keyword-only, one transaction each, commands leave on commit.

State machine (owned by `ray_cluster_transition`, the only writer of `RayCluster.status`):

    pending  → running | failed | stopping (stop) | deleting
    running  → failed | stopping (stop) | deleting
    failed   → pending (start) | stopping (stop) | deleting
    stopping → stopped (every Ray node's stop finished; containers gone) | deleting
    stopped  → pending (start) | stopping (a Ray node that started after its stop is stopped again) | deleting
    deleting → (row deleted once every Ray node is stopped)

Start while stopping is refused (409, "wait until it has stopped"). A Ray node whose stop is in flight
is never sent a second stop (`stop_in_flight`): Stop then Delete waits for the same stop.

Everything that touches a machine is a fleet `Command` dispatched with `fleet.services.command_queue`
(`ray.head.start`, `ray.worker.start`, `ray.node.drain`, `ray.node.stop`, `ray.status`); results come
back through `ray_on_command_finished`, connected to `fleet.signals.command_finished`.

On `kubernetes` and `argocd` compute clusters a Ray cluster is one KubeRay ``RayCluster`` (runtime
``kuberay``): the head's RayNode stands for the whole resource and sits on the agent node that applies
it; KubeRay's in-tree autoscaler runs the worker group (min/max workers, idle timeout), so the control
plane starts no workers and only asks for status. Stop suspends the RayCluster (``spec.suspend``: the
pods go, the resource, its name and head Service stay, as "stopped: state preserved" promises), start
resumes it, delete deletes it (argocd: the same as commits).

Modules: `common` (constants, events, whom automatic work runs as, dispatch), `transitions` (the state
machine), `lifecycle` (create/update/start/stop/delete), `launch` (the head per runtime: `hosts` for
docker/process, `kuberay`; stopping and draining Ray nodes), `results` (command results, recorded status),
`autoscale` (the autoscaler and its beat pass).
"""

from raymgr.services.autoscale import autoscale_pass, ray_cluster_autoscale
from raymgr.services.common import (
    DELETE_GRACE,
    KUBE_MODES,
    KUBERAY_GCS_PORT,
    PORT_HOLDING,
    STATUS_LOG_LINES,
    STATUS_MAX_AGE,
    STOP_GRACE,
    UPDATABLE,
    dispatch,
    head_gcs_port,
    operator_for,
    ray_cluster_stopping,
    record_event,
    running_head,
    stop_in_flight,
)
from raymgr.services.lifecycle import (
    ray_cluster_create,
    ray_cluster_delete,
    ray_cluster_finish_delete,
    ray_cluster_finish_stop,
    ray_cluster_start,
    ray_cluster_stop,
    ray_cluster_update,
    runtime_for,
)
from raymgr.services.results import ray_cluster_record_status, ray_on_command_finished
from raymgr.services.transitions import REFUSALS, TRANSITIONS, ray_cluster_transition, ray_node_set_status

__all__ = [
    "DELETE_GRACE",
    "KUBERAY_GCS_PORT",
    "KUBE_MODES",
    "PORT_HOLDING",
    "REFUSALS",
    "STATUS_LOG_LINES",
    "STATUS_MAX_AGE",
    "STOP_GRACE",
    "TRANSITIONS",
    "UPDATABLE",
    "autoscale_pass",
    "dispatch",
    "head_gcs_port",
    "operator_for",
    "ray_cluster_autoscale",
    "ray_cluster_create",
    "ray_cluster_delete",
    "ray_cluster_finish_delete",
    "ray_cluster_finish_stop",
    "ray_cluster_record_status",
    "ray_cluster_start",
    "ray_cluster_stop",
    "ray_cluster_stopping",
    "ray_cluster_transition",
    "ray_cluster_update",
    "ray_node_set_status",
    "ray_on_command_finished",
    "record_event",
    "running_head",
    "runtime_for",
    "stop_in_flight",
]
