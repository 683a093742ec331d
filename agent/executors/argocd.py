"""ArgoCD mode: workloads are Kubernetes manifests committed to a Git repository that ArgoCD syncs.

Each command edits ``manifests/<name>.yaml`` in a clone of `repo_url`/`branch` under `workdir` (the
same manifests as kubernetes mode, from `agent.executors.manifests`), commits
``cleverthis: <verb> container <name> (<container id>)``, pushes, then asks the ArgoCD API to sync
`app_name` (``POST /api/v1/applications/<app>/sync``, bearer token, prune on so destroyed workloads go).
create writes the Deployment/Service/Ingress, stop/start rewrite it with 0/1 replicas, destroy removes
the file.

Commits are serialized by a threading lock plus an ``flock`` on a file in `workdir` (several agents or
executors may share one). Before each change the clone is reset to the remote branch; when a push is
rejected (someone else pushed first) the change is re-applied on top of the new remote head and pushed
again, so concurrent changes never lose each other. The container id is the stable
`manifests.workload_id(command_key)`, as in kubernetes mode. `list_containers` reports the desired state
in the repository (replicas 0 = stopped, otherwise running): the agent does not watch the cluster here.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import git
import requests
from git.exc import GitCommandError

from agent.errors import CommandFailed
from agent.executors import manifests as mf
from agent.executors.base import ProgressFn
from agent.protocol import ContainerCreatePayload, ContainerInfo, ContainerRefPayload, ContainerResult

MANIFEST_DIR = "manifests"
AUTHOR_NAME = "CleverThis Agent"
AUTHOR_EMAIL = "agent@cleverthis.invalid"


class ArgoCDExecutor:
    """Runs container commands as Git commits to an ArgoCD-managed repository plus a sync call."""

    mode = "argocd"

    def __init__(
        self,
        repo_url: str,
        branch: str,
        server: str,
        token: str,
        app_name: str,
        workdir: Path | str,
        *,
        namespace: str | None = None,
        push_attempts: int = 10,
        verify_tls: bool = True,
        timeout_s: float = 30.0,
    ) -> None:
        self.repo_url = repo_url
        self.branch = branch or "main"
        self.server = server.rstrip("/")
        self.token = token
        self.app_name = app_name
        self.workdir = Path(workdir)
        self.namespace = namespace or mf.NAMESPACE
        self.push_attempts = push_attempts
        self.verify_tls = verify_tls
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._repo: git.Repo | None = None

    # ---- Executor interface

    def execute(self, command_type: str, payload: Any, *, command_key: str, progress: ProgressFn) -> ContainerResult:
        """Run one container.* command; see `agent.executors.base.Executor`."""
        if command_type == "container.create":
            return self.create(payload, command_key=command_key, progress=progress)
        if command_type == "container.start":
            return self._scale(payload, 1, "start", progress)
        if command_type == "container.stop":
            return self._scale(payload, 0, "stop", progress)
        if command_type == "container.destroy":
            return self.destroy(payload, progress)
        raise CommandFailed("unknown_command", f"the argocd executor does not run {command_type!r}")

    def list_containers(self) -> list[ContainerInfo]:
        """The workloads described in the branch (desired state)."""
        with self._locked() as repo:
            return [self._info(objs) for objs in self._all(repo).values()]

    # ---- commands

    def create(self, payload: ContainerCreatePayload, *, command_key: str, progress: ProgressFn) -> ContainerResult:
        """Commit the workload's manifests (unless this key's workload is already there) and sync."""
        wid = mf.workload_id(command_key)
        if payload.registry_username or payload.registry_password:
            raise CommandFailed(
                "unsupported",
                "argocd mode does not commit registry credentials to Git: create an imagePullSecret in the "
                "cluster (e.g. with the cluster's secret tooling) and use a public reference or that secret",
            )
        try:
            objects = mf.build_manifests(payload, command_key=command_key, namespace=self.namespace)
        except ValueError as exc:
            raise CommandFailed("invalid_payload", str(exc)) from None
        name = objects[0]["metadata"]["name"]
        existed = False

        def change(repo: git.Repo) -> bool:
            nonlocal existed
            current = self._all(repo)
            if any(_workload_id(objs) == wid for objs in current.values()):
                existed = True
                return False
            if name in current:
                raise CommandFailed("conflict", f"{MANIFEST_DIR}/{name}.yaml already describes another workload")
            self._write(repo, name, objects)
            return True

        commit = self._commit(change, f"cleverthis: deploy container {name} ({wid})", progress)
        self._sync(progress)
        status = "running" if payload.start else "stopped"
        return ContainerResult(container_id=wid, name=name, status=status, commit=commit, existed=existed)

    def _scale(self, payload: ContainerRefPayload, replicas: int, verb: str, progress: ProgressFn) -> ContainerResult:
        found: dict[str, Any] = {}

        def change(repo: git.Repo) -> bool:
            name, objs = self._find(repo, payload.container)
            found.update(name=name, wid=_workload_id(objs))
            if _replicas(objs) == replicas:
                return False
            self._write(repo, name, mf.scaled(objs, replicas))
            return True

        commit = self._commit(
            change, lambda: f"cleverthis: {verb} container {found['name']} ({found['wid']})", progress
        )
        self._sync(progress)
        status = "running" if replicas else "stopped"
        return ContainerResult(container_id=found["wid"], name=found["name"], status=status, commit=commit)

    def destroy(self, payload: ContainerRefPayload, progress: ProgressFn) -> ContainerResult:
        """Remove the workload's manifest file, commit and sync (prune deletes it from the cluster)."""
        found: dict[str, Any] = {}

        def change(repo: git.Repo) -> bool:
            try:
                name, objs = self._find(repo, payload.container)
            except CommandFailed:
                return False
            found.update(name=name, wid=_workload_id(objs))
            (Path(repo.working_tree_dir) / MANIFEST_DIR / f"{name}.yaml").unlink()
            return True

        commit = self._commit(
            change, lambda: f"cleverthis: destroy container {found['name']} ({found['wid']})", progress
        )
        self._sync(progress)
        return ContainerResult(
            container_id=found.get("wid", payload.container),
            name=found.get("name", ""),
            status="missing",
            commit=commit,
        )

    # ---- git

    @contextlib.contextmanager
    def _locked(self) -> Iterator[git.Repo]:
        """The clone, reset to the remote branch, held under the thread and file locks."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self._lock, (self.workdir / ".cleverthis-gitops.lock").open("w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                try:
                    repo = self._clone()
                    self._reset(repo)
                except GitCommandError as exc:
                    raise CommandFailed(
                        "gitops_failed", f"updating the GitOps clone failed: {_git_reason(exc)}"
                    ) from None
                yield repo
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def _clone(self) -> git.Repo:
        if self._repo is not None:
            return self._repo
        path = self.workdir / "repo"
        if (path / ".git").is_dir():
            repo = git.Repo(path)
        else:
            repo = git.Repo.clone_from(self.repo_url, path, no_checkout=True)
        with repo.config_writer() as cfg:
            cfg.set_value("user", "name", AUTHOR_NAME)
            cfg.set_value("user", "email", AUTHOR_EMAIL)
        self._repo = repo
        return repo

    def _remote_head(self, repo: git.Repo) -> str | None:
        try:
            return repo.git.rev_parse("--verify", "-q", f"refs/remotes/origin/{self.branch}")
        except GitCommandError:
            return None

    def _reset(self, repo: git.Repo) -> None:
        repo.git.fetch("origin", "--prune")
        if self._remote_head(repo) is not None:
            repo.git.checkout("-B", self.branch, f"origin/{self.branch}")
            repo.git.reset("--hard", f"origin/{self.branch}")
        else:  # empty repository or new branch: start it from nothing
            repo.git.checkout("--orphan", f"cleverthis-tmp-{id(self)}")
            repo.git.rm("-rf", "--cached", "--ignore-unmatch", ".")
            with contextlib.suppress(GitCommandError):
                repo.git.branch("-D", self.branch)
            repo.git.checkout("--orphan", self.branch)
        repo.git.clean("-fdx")

    def _commit(
        self, change: Callable[[git.Repo], bool], message: str | Callable[[], str], progress: ProgressFn
    ) -> str:
        """Apply `change` on the remote head, commit and push; retried on a rejected push. Returns HEAD."""
        last_error = ""
        for attempt in range(1, self.push_attempts + 1):
            with self._locked() as repo:
                if not change(repo):
                    head = self._remote_head(repo)
                    return head or ""
                try:
                    repo.git.add("-A", MANIFEST_DIR)
                    text = message() if callable(message) else message
                    repo.git.commit("-m", text)
                    commit = repo.head.commit.hexsha
                    progress(f"committed {commit[:12]}: {text}")
                    repo.git.push("origin", f"HEAD:refs/heads/{self.branch}")
                except GitCommandError as exc:
                    last_error = _git_reason(exc)
                    progress(f"push attempt {attempt} rejected, re-applying on the new remote head")
                    continue
                progress(f"pushed {commit[:12]} to {self.branch}")
                return commit
        raise CommandFailed(
            "gitops_failed", f"pushing to {self.branch} failed {self.push_attempts} times: {last_error}"
        )

    def _all(self, repo: git.Repo) -> dict[str, list[dict[str, Any]]]:
        folder = Path(repo.working_tree_dir) / MANIFEST_DIR
        found: dict[str, list[dict[str, Any]]] = {}
        for path in sorted(folder.glob("*.yaml")):
            try:
                objs = mf.from_yaml(path.read_text())
            except ValueError:
                continue
            if any(o.get("kind") == "Deployment" for o in objs):
                found[path.stem] = objs
        return found

    def _find(self, repo: git.Repo, ref: str) -> tuple[str, list[dict[str, Any]]]:
        workloads = self._all(repo)
        for name, objs in workloads.items():
            if _workload_id(objs) == ref:
                return name, objs
        with contextlib.suppress(ValueError):
            name = mf.resource_name(ref)
            if name in workloads:
                return name, workloads[name]
        raise CommandFailed("not_found", f"no workload {ref!r} in {MANIFEST_DIR}/ of {self.branch}")

    def _write(self, repo: git.Repo, name: str, objects: list[dict[str, Any]]) -> None:
        folder = Path(repo.working_tree_dir) / MANIFEST_DIR
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.yaml").write_text(mf.to_yaml(objects))

    # ---- ArgoCD

    def _sync(self, progress: ProgressFn) -> None:
        url = f"{self.server}/api/v1/applications/{self.app_name}/sync"
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        try:
            response = requests.post(
                url,
                json={"revision": self.branch, "prune": True},
                headers=headers,
                timeout=self.timeout_s,
                verify=self.verify_tls,
            )
        except requests.RequestException as exc:
            raise CommandFailed("argocd_sync_failed", f"ArgoCD not reachable at {self.server}: {exc}") from None
        if response.status_code >= 300:
            try:
                reason = response.json().get("message") or response.text
            except ValueError:
                reason = response.text
            raise CommandFailed(
                "argocd_sync_failed",
                f"ArgoCD refused to sync {self.app_name}: {response.status_code} {reason[:500]}",
                status=response.status_code,
            )
        progress(f"ArgoCD sync of {self.app_name} requested")

    # ---- inventory

    def _info(self, objs: list[dict[str, Any]]) -> ContainerInfo:
        deployment = next(o for o in objs if o.get("kind") == "Deployment")
        meta = deployment.get("metadata", {})
        containers = deployment.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or [{}]
        return ContainerInfo(
            container_id=_workload_id(objs),
            name=meta.get("name", ""),
            image=containers[0].get("image", ""),
            status="stopped" if _replicas(objs) == 0 else "running",
            command_key=(meta.get("annotations") or {}).get(mf.COMMAND_KEY_ANNOTATION, ""),
            labels=dict(meta.get("labels") or {}),
        )


def _deployment(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return next((o for o in objs if o.get("kind") == "Deployment"), {})


def _workload_id(objs: list[dict[str, Any]]) -> str:
    return (_deployment(objs).get("metadata", {}).get("labels") or {}).get(mf.WORKLOAD_LABEL, "")


def _replicas(objs: list[dict[str, Any]]) -> int:
    return int(_deployment(objs).get("spec", {}).get("replicas", 1))


def _git_reason(exc: GitCommandError) -> str:
    """Git's complaint on one line, with any credentials in URLs masked."""
    text = (exc.stderr or str(exc)).strip()
    text = re.sub(r"://[^/@\s]+@", "://***@", text)
    return " ".join(text.split())[:500]
