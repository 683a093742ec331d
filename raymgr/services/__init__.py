"""Writes for managed Ray clusters. Keyword-only, one transaction each, commands leave on commit.

State machine (owned by `ray_cluster_transition`, the only writer of `RayCluster.status`):

    pending  → running | failed | stopped | deleting
    running  → failed | stopped | deleting
    failed   → pending (start) | stopped | deleting
    stopped  → pending (start) | deleting
    deleting → (row deleted once every Ray node is stopped)

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
    PORT_HOLDING,
    STATUS_LOG_LINES,
    STATUS_MAX_AGE,
    UPDATABLE,
    dispatch,
    operator_for,
    ray_cluster_stopping,
    record_event,
    running_head,
)
from raymgr.services.lifecycle import (
    ray_cluster_create,
    ray_cluster_delete,
    ray_cluster_finish_delete,
    ray_cluster_start,
    ray_cluster_stop,
    ray_cluster_update,
    runtime_for,
)
from raymgr.services.results import ray_cluster_record_status, ray_on_command_finished
from raymgr.services.transitions import TRANSITIONS, ray_cluster_transition, ray_node_set_status

__all__ = [
    "DELETE_GRACE",
    "KUBE_MODES",
    "PORT_HOLDING",
    "STATUS_LOG_LINES",
    "STATUS_MAX_AGE",
    "TRANSITIONS",
    "UPDATABLE",
    "autoscale_pass",
    "dispatch",
    "operator_for",
    "ray_cluster_autoscale",
    "ray_cluster_create",
    "ray_cluster_delete",
    "ray_cluster_finish_delete",
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
]
