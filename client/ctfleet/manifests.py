"""Declarative YAML for `ctfleet apply -f` / `delete -f`: one schema per kind, validated before anything is
sent; a plan (create / update / unchanged / delete) computed against the live state; then the changes.

    apiVersion: ctfleet/v1
    kind: Endpoint
    metadata: {workspace: demo}
    spec: {cluster: lab, model_id: acme/tiny, revision: main}

Identity: Cluster, RayCluster, TrainingJob, TuneExperiment and ServeDeployment by `metadata.name` in the
workspace; Endpoint by its cluster and model (among those not stopped); Quota by the workspace. A second
`apply` of the same files finds everything unchanged and sends nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctfleet import errors
from ctfleet.resources import is_uuid

API_VERSION = "ctfleet/v1"


@dataclass(frozen=True)
class Field:
    """One spec field: its Python type(s), whether it is required, and whether apply may change it in place."""

    types: tuple[type, ...]
    required: bool = False
    mutable: bool = False


S, INT, F, B, L, D = (str,), (int,), (int, float), (bool,), (list,), (dict,)

KINDS: dict[str, dict[str, Field]] = {
    "Cluster": {
        "mode": Field(S),
        "description": Field(S, mutable=True),
        "argocd_server": Field(S, mutable=True),
        "git_repo_url": Field(S, mutable=True),
        "git_branch": Field(S, mutable=True),
    },
    "Endpoint": {
        "cluster": Field(S, required=True),
        "model_id": Field(S, required=True),
        "revision": Field(S, mutable=True),
        "server_args": Field(L, mutable=True),
        "node": Field(S),
        "gpus": Field(INT),
        "min_vram_mb": Field(INT),
        "public": Field(B),
        "min_replicas": Field(INT),
        "max_replicas": Field(INT),
        "target_requests_per_min": Field(INT),
        "target_in_flight": Field(INT),
        "target_tokens_per_s": Field(INT),
        "scale_cooldown_s": Field(INT),
        "idle_timeout_s": Field(INT),
    },
    "RayCluster": {
        "compute_cluster": Field(S, required=True),
        "runtime": Field(S),
        "ray_version": Field(S, mutable=True),
        "min_workers": Field(INT, mutable=True),
        "max_workers": Field(INT, mutable=True),
        "idle_timeout_s": Field(INT, mutable=True),
        "checkpoint_on_stop": Field(B, mutable=True),
        "gcs_port": Field(INT),
        "dashboard_port": Field(INT),
        "worker_cpus": Field(F),
        "worker_memory_mb": Field(INT),
        "worker_gpus": Field(INT),
    },
    "TrainingJob": {
        "ray_cluster": Field(S, required=True),
        "kind": Field(S),
        "script": Field(S),
        "entrypoint": Field(S),
        "framework": Field(S),
        "config": Field(D),
        "num_workers": Field(INT),
        "cpus_per_worker": Field(F),
        "gpus_per_worker": Field(F),
        "checkpoint_every": Field(INT),
        "checkpoints_to_keep": Field(INT),
        "storage_path": Field(S),
    },
    "TuneExperiment": {
        "ray_cluster": Field(S, required=True),
        "search_space": Field((dict, list), required=True),
        "metric": Field(S),
        "mode": Field(S),
        "num_samples": Field(INT),
        "max_concurrent_trials": Field(INT),
        "max_iterations": Field(INT),
        "scheduler": Field(S),
        "scheduler_config": Field(D),
        "objective_code": Field(S),
        "cpus_per_trial": Field(F),
        "gpus_per_trial": Field(F),
        "training_script": Field(S),
    },
    "ServeDeployment": {
        "ray_cluster": Field(S, required=True),
        "engine": Field(S),
        "model": Field(S),
        "checkpoint_job": Field(S),
        "checkpoint_path": Field(S),
        "code": Field(S),
        "route_prefix": Field(S),
        "http_port": Field(INT),
        "num_replicas": Field(INT),
        "autoscaling": Field(B),
        "min_replicas": Field(INT),
        "max_replicas": Field(INT),
        "target_ongoing_requests": Field(F),
        "cpus_per_replica": Field(F),
        "gpus_per_replica": Field(F),
    },
    # Quota: any of the workspace's quota names (gpus, endpoints, …) → a number, or null for unlimited.
    "Quota": {},
}
NAMED_KINDS = {"Cluster", "RayCluster", "TrainingJob", "TuneExperiment", "ServeDeployment"}
PATHS = {
    "Cluster": "api/v1/clusters/",
    "Endpoint": "api/v1/endpoints/",
    "RayCluster": "api/v1/ray/clusters/",
    "TrainingJob": "api/v1/ray/training-jobs/",
    "TuneExperiment": "api/v1/ray/tune-experiments/",
    "ServeDeployment": "api/v1/ray/deployments/",
}
# What --wait waits for: (states that are ready, states that are a failure).
READY = {
    "Endpoint": ({"running"}, {"failed", "stopped"}),
    "RayCluster": ({"running"}, {"failed", "stopped"}),
    "TrainingJob": ({"succeeded"}, {"failed", "cancelled"}),
    "TuneExperiment": ({"succeeded"}, {"failed", "cancelled"}),
    "ServeDeployment": ({"running"}, {"failed", "unhealthy", "stopped"}),
}
GONE = {"stopped", "stopping", "failed", "deleting", "cancelled", "succeeded"}


@dataclass
class Manifest:
    """One validated document: its kind, workspace reference, name, spec and where it came from."""

    kind: str
    workspace: str | None
    name: str | None
    spec: dict[str, Any]
    source: str

    @property
    def title(self) -> str:
        if self.kind == "Endpoint":
            return f"Endpoint {self.spec['model_id']} on {self.spec['cluster']}"
        if self.kind == "Quota":
            return f"Quota of {self.workspace or 'the default workspace'}"
        return f"{self.kind} {self.name}"


@dataclass
class Step:
    """One line of a plan: `action` create | update | unchanged | delete | absent | refused."""

    manifest: Manifest
    action: str
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    current: dict[str, Any] | None = None
    body: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    build: Callable[[], dict[str, Any]] | None = None

    def line(self) -> str:
        mark = {"create": "+", "update": "~", "delete": "-", "refused": "!"}.get(self.action, "=")
        text = f"{mark} {self.manifest.title}: {self.action}"
        if self.changes:
            text += " (" + ", ".join(f"{k}: {_short(a)} → {_short(b)}" for k, (a, b) in self.changes.items()) + ")"
        if self.reason:
            text += f" — {self.reason}"
        return text


def _short(value: Any) -> str:
    text = "unset" if value is None else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---- reading and validating --------------------------------------------------------------------------


def files_of(paths: Iterable[str]) -> list[Path]:
    """The YAML files named, a folder standing for its *.yaml / *.yml files (sorted)."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out += sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        elif path.is_file():
            out.append(path)
        else:
            raise errors.InvalidInput(f"{raw}: no such file or folder.")
    if not out:
        raise errors.InvalidInput("No YAML files found.", hint="Name a .yaml file or a folder holding some.")
    return out


def load(paths: Iterable[str], default_workspace: str | None = None) -> list[Manifest]:
    """Every document of the files, validated; all problems of all files are reported at once."""
    import yaml

    manifests: list[Manifest] = []
    problems: list[str] = []
    for path in files_of(paths):
        try:
            docs = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError as exc:
            problems.append(f"{path}: not valid YAML: {exc}")
            continue
        for index, doc in enumerate(d for d in docs if d is not None):
            source = f"{path}#{index + 1}"
            found, manifest = validate(doc, source, default_workspace)
            problems += found
            if manifest is not None:
                manifests.append(manifest)
    if problems:
        raise errors.InvalidInput("The manifests do not validate:\n  " + "\n  ".join(problems))
    return manifests


def validate(doc: Any, source: str, default_workspace: str | None = None) -> tuple[list[str], Manifest | None]:
    """(problems, manifest) of one YAML document against its kind's schema."""
    if not isinstance(doc, dict):
        return [f"{source}: a document must be a mapping with kind, metadata and spec."], None
    problems = [
        f"{source}: unknown top-level field {k!r}." for k in doc if k not in ("apiVersion", "kind", "metadata", "spec")
    ]
    if doc.get("apiVersion", API_VERSION) != API_VERSION:
        problems.append(f"{source}: apiVersion must be {API_VERSION}.")
    kind = doc.get("kind")
    if kind not in KINDS:
        return [*problems, f"{source}: kind must be one of {', '.join(KINDS)} (got {kind!r})."], None
    metadata = doc.get("metadata") or {}
    spec = doc.get("spec") or {}
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        return [*problems, f"{source}: metadata and spec must be mappings."], None
    problems += [f"{source}: unknown metadata field {k!r}." for k in metadata if k not in ("name", "workspace")]
    name = metadata.get("name")
    if kind in NAMED_KINDS and not (isinstance(name, str) and name):
        problems.append(f"{source}: {kind} needs metadata.name.")
    workspace = metadata.get("workspace") or default_workspace
    schema = KINDS[kind]
    if kind == "Quota":
        for key, value in spec.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
                problems.append(f"{source}: spec.{key} must be a number ≥ 0, or null for unlimited.")
    else:
        for key, value in spec.items():
            if key not in schema:
                problems.append(f"{source}: unknown spec field {key!r} for {kind} (known: {', '.join(schema)}).")
            elif value is not None and (
                not isinstance(value, schema[key].types) or (isinstance(value, bool) and bool not in schema[key].types)
            ):
                wanted = " or ".join(t.__name__ for t in schema[key].types)
                problems.append(f"{source}: spec.{key} must be {wanted} (got {type(value).__name__}).")
        problems += [f"{source}: {kind} needs spec.{k}." for k, f in schema.items() if f.required and k not in spec]
    return problems, (Manifest(kind, workspace, name, dict(spec), source) if not problems else None)


# ---- planning and applying ---------------------------------------------------------------------------


class Resolver:
    """Turns names in manifests (workspaces, clusters, Ray clusters) into ids, asking the API once each."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._cache: dict[tuple[str, str | None, str], dict[str, Any]] = {}

    def workspace(self, ref: str | None) -> dict[str, Any]:
        rows = list(self.client.paginate("api/v1/workspaces/"))
        if ref is None:
            if len(rows) == 1:
                return rows[0]
            raise errors.InvalidInput(
                "Which workspace? This key reaches several.", hint="Set metadata.workspace, or pass --workspace."
            )
        for row in rows:
            if ref in (row["id"], row["slug"], row["name"]):
                return row
        raise errors.NotFound(404, {"detail": f"No workspace {ref!r} reachable with this key."})

    def named(self, path: str, workspace_id: str | None, ref: str, what: str, *, missing_ok: bool = False) -> Any:
        key = (path, workspace_id, ref)
        if key in self._cache:
            return self._cache[key]
        found = None
        params = {"workspace": workspace_id} if workspace_id and "ray/" not in path else {}
        for row in self.client.paginate(path, params):
            if workspace_id and row.get("workspace") not in (None, workspace_id):
                continue
            if ref == row.get("id") or ref == row.get("name"):
                found = row
                break
        if found is None and not missing_ok:
            raise errors.NotFound(404, {"detail": f"No {what} {ref!r} in this workspace."})
        if found is not None:
            self._cache[key] = found
        return found


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def plan(client: Any, manifests: list[Manifest], *, deleting: bool = False) -> list[Step]:
    """What `apply` (or `delete`) would do for each manifest, against the live state."""
    resolver = Resolver(client)
    steps: list[Step] = []
    for m in manifests:
        ws = resolver.workspace(m.workspace)
        steps.append(_plan_delete(client, resolver, ws, m) if deleting else _plan_apply(client, resolver, ws, m))
    return steps


def _current(client: Any, resolver: Resolver, ws: dict[str, Any], m: Manifest) -> dict[str, Any] | None:
    if m.kind in NAMED_KINDS:
        return resolver.named(PATHS[m.kind], ws["id"], m.name or "", m.kind, missing_ok=True)
    if m.kind == "Endpoint":
        cluster = resolver.named("api/v1/clusters/", ws["id"], m.spec["cluster"], "cluster", missing_ok=True)
        if cluster is None:  # made by an earlier document of the same apply, else refused when sent
            return None
        for row in client.paginate("api/v1/endpoints/", {"cluster": cluster["id"]}):
            if row["model_id"] == m.spec["model_id"] and row["status"] not in ("stopped", "stopping"):
                return row
        return None
    return client.get(f"api/v1/workspaces/{ws['id']}/quotas/")


def _plan_apply(client: Any, resolver: Resolver, ws: dict[str, Any], m: Manifest) -> Step:
    current = _current(client, resolver, ws, m)
    if m.kind == "Quota":
        limits = {line["quota"]: line["limit"] for line in current["quotas"]}
        unknown = sorted(set(m.spec) - set(limits))
        if unknown:
            raise errors.InvalidInput(f"{m.source}: unknown quota {', '.join(unknown)} (known: {', '.join(limits)}).")
        changes = {k: (limits[k], v) for k, v in m.spec.items() if not _same(limits[k], v)}
        return Step(m, "update" if changes else "unchanged", changes, current, {k: v for k, (_, v) in changes.items()})
    if current is None:  # the body is built when sent: it may name what an earlier document creates
        return Step(m, "create", {}, None, build=lambda: _create_body(resolver, ws, m))
    if m.kind in ("TrainingJob", "TuneExperiment", "ServeDeployment"):
        return Step(m, "unchanged", {}, current, reason="submitted once; delete it to submit again")
    schema = KINDS[m.kind]
    changes: dict[str, tuple[Any, Any]] = {}
    fixed: list[str] = []
    for key, wanted in m.spec.items():
        if key in ("cluster", "compute_cluster", "node", "model_id") or key not in current:
            continue
        if _same(current.get(key), wanted):
            continue
        if schema[key].mutable:
            changes[key] = (current.get(key), wanted)
        else:
            fixed.append(f"{key} ({_short(current.get(key))} → {_short(wanted)})")
    if fixed:
        return Step(m, "refused", changes, current, reason="cannot change in place: " + ", ".join(fixed))
    return Step(m, "update" if changes else "unchanged", changes, current, {k: v for k, (_, v) in changes.items()})


def _create_body(resolver: Resolver, ws: dict[str, Any], m: Manifest) -> dict[str, Any]:
    body = dict(m.spec)
    if m.kind == "Cluster":
        return {"workspace": ws["id"], "name": m.name, **body}
    if m.kind == "Endpoint":
        cluster = resolver.named("api/v1/clusters/", ws["id"], body["cluster"], "cluster")
        body["cluster"] = cluster["id"]
        if body.get("node") and not is_uuid(body["node"]):
            body["node"] = resolver.named("api/v1/nodes/", None, body["node"], "node")["id"]
        return body
    if m.kind == "RayCluster":
        body["compute_cluster"] = resolver.named("api/v1/clusters/", ws["id"], body["compute_cluster"], "cluster")["id"]
        return {"workspace": ws["id"], "name": m.name, **body}
    body["ray_cluster"] = resolver.named(PATHS["RayCluster"], ws["id"], body["ray_cluster"], "Ray cluster")["id"]
    return {"workspace": ws["id"], "name": m.name, **body}


def _plan_delete(client: Any, resolver: Resolver, ws: dict[str, Any], m: Manifest) -> Step:
    current = _current(client, resolver, ws, m)
    if m.kind == "Quota":
        limits = {line["quota"]: line["limit"] for line in current["quotas"]}
        changes = {k: (limits.get(k), None) for k in m.spec if limits.get(k) is not None}
        return Step(m, "delete" if changes else "absent", changes, current, dict.fromkeys(changes))
    gone = {"deleting"} if m.kind in ("Cluster", "RayCluster") else GONE  # rows deleted, not only stopped
    if current is None or current.get("status") in gone:
        return Step(m, "absent", {}, current)
    return Step(m, "delete", {}, current)


def execute(client: Any, step: Step, *, deleting: bool = False) -> dict[str, Any] | None:
    """Carry out one step of a plan; answers the object as the server left it."""
    m = step.manifest
    if step.action in ("unchanged", "absent", "refused"):
        return step.current
    if m.kind == "Quota":
        return client.patch(f"api/v1/workspaces/{step.current['workspace']}/quotas/", step.body)
    path = PATHS[m.kind]
    if deleting:
        oid = step.current["id"]
        if m.kind in ("Cluster", "RayCluster"):
            return client.delete(f"{path}{oid}/")
        verb = "cancel" if m.kind in ("TrainingJob", "TuneExperiment") else "stop"
        return client.post(f"{path}{oid}/{verb}/")
    if step.action == "create":
        return client.post(path, step.build() if step.build else step.body)
    oid = step.current["id"]
    if m.kind == "Endpoint":
        return client.post(f"{path}{oid}/update/", step.body)
    return client.patch(f"{path}{oid}/", step.body)


def waiter(client: Any, m: Manifest, obj: dict[str, Any]) -> Callable[[float], dict[str, Any]] | None:
    """A function waiting (up to its argument, in seconds) until `obj` is ready; None for kinds ready at once."""
    if m.kind not in READY or not obj or "id" not in obj:
        return None
    ready, failed = READY[m.kind]
    url = f"{PATHS[m.kind]}{obj['id']}/"
    return lambda timeout: client.wait_for(
        lambda: client.get(url),
        lambda o: o.get("status") in ready,
        failed=lambda o: o.get("status") in failed,
        timeout=timeout,
        what=m.title,
    )
