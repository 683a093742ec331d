"""ArgoCDExecutor with GitPython against a real local bare repository and an ArgoCD sync stand-in."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import CommandFailed
from agent.executors import manifests as mf
from agent.executors.argocd import ArgoCDExecutor
from agent.protocol import ContainerCreatePayload, ContainerRefPayload, PortMapping
from tests.support.argocd_standin import ArgoCDStandin
from tests.support.processes import free_port

BRANCH = "deploy"


def quiet(*_args: object, **_kwargs: object) -> None:
    """A ProgressFn that ignores its calls."""


def git(bare: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(bare), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    path = tmp_path / "gitops.git"
    subprocess.run(["git", "init", "--bare", "-q", str(path)], check=True)
    return path


@pytest.fixture
def argocd() -> Iterator[ArgoCDStandin]:
    standin = ArgoCDStandin().start()
    yield standin
    standin.stop()


def make_executor(bare: Path, argocd: ArgoCDStandin, workdir: Path, **overrides: object) -> ArgoCDExecutor:
    values: dict = {
        "repo_url": str(bare),
        "branch": BRANCH,
        "server": argocd.url,
        "token": argocd.token,
        "app_name": "workloads",
        "workdir": workdir,
    }
    values.update(overrides)
    return ArgoCDExecutor(**values)


@pytest.fixture
def executor(bare: Path, argocd: ArgoCDStandin, tmp_path: Path) -> ArgoCDExecutor:
    return make_executor(bare, argocd, tmp_path / "agent-a")


def web(name: str = "web", **overrides: object) -> ContainerCreatePayload:
    values: dict = {"image": "nginx:1.27", "name": name, "ports": [PortMapping(container_port=80)]}
    values.update(overrides)
    return ContainerCreatePayload(**values)


def tree(bare: Path) -> list[str]:
    return git(bare, "ls-tree", "-r", "--name-only", BRANCH).split()


def manifest(bare: Path, name: str) -> list[dict]:
    return mf.from_yaml(git(bare, "show", f"{BRANCH}:manifests/{name}.yaml"))


def test_deploy_commits_the_kubernetes_manifests_pushes_and_syncs(executor, bare, argocd):
    result = executor.execute("container.create", web(endpoint_host="web.test"), command_key="k1", progress=quiet)

    wid = mf.workload_id("k1")
    assert result.container_id == wid
    assert tree(bare) == ["manifests/web.yaml"]
    objects = manifest(bare, "web")
    assert objects == mf.build_manifests(web(endpoint_host="web.test"), command_key="k1")
    assert [o["kind"] for o in objects] == ["Deployment", "Service", "Ingress"]
    assert git(bare, "log", "-1", "--format=%s", BRANCH).strip() == f"cleverthis: deploy container web ({wid})"
    assert git(bare, "rev-parse", BRANCH).strip() == result.commit
    [call] = argocd.calls
    assert call.app == "workloads"
    assert call.authorization == f"Bearer {argocd.token}"
    assert call.body["prune"] is True


def test_repeated_key_does_not_commit_again(executor, bare):
    executor.execute("container.create", web(), command_key="k1", progress=quiet)
    again = executor.execute("container.create", web("renamed"), command_key="k1", progress=quiet)
    assert again.existed is True
    assert git(bare, "rev-list", "--count", BRANCH).strip() == "1"


def test_stop_start_destroy_commit_scaled_and_removed_manifests(executor, bare, argocd):
    created = executor.execute("container.create", web(), command_key="k1", progress=quiet)
    ref = ContainerRefPayload(container=created.container_id)

    executor.execute("container.stop", ref, command_key="s", progress=quiet)
    assert manifest(bare, "web")[0]["spec"]["replicas"] == 0
    assert [c.status for c in executor.list_containers()] == ["stopped"]
    executor.execute("container.start", ContainerRefPayload(container="web"), command_key="t", progress=quiet)
    assert manifest(bare, "web")[0]["spec"]["replicas"] == 1
    executor.execute("container.destroy", ref, command_key="d", progress=quiet)
    assert tree(bare) == []
    subjects = git(bare, "log", "--format=%s", BRANCH).splitlines()
    wid = created.container_id
    assert subjects == [
        f"cleverthis: destroy container web ({wid})",
        f"cleverthis: start container web ({wid})",
        f"cleverthis: stop container web ({wid})",
        f"cleverthis: deploy container web ({wid})",
    ]
    assert len(argocd.calls) == 4
    assert executor.list_containers() == []
    with pytest.raises(CommandFailed) as err:
        executor.execute("container.stop", ref, command_key="s2", progress=quiet)
    assert err.value.code == "not_found"


def test_concurrent_deploys_from_two_agents_all_land(bare, argocd, tmp_path):
    agents = [make_executor(bare, argocd, tmp_path / "a"), make_executor(bare, argocd, tmp_path / "b")]
    errors: list[BaseException] = []

    def deploy(i: int) -> None:
        try:
            agents[i % 2].execute("container.create", web(f"app-{i}"), command_key=f"key-{i}", progress=quiet)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=deploy, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert tree(bare) == sorted(f"manifests/app-{i}.yaml" for i in range(8))
    assert git(bare, "rev-list", "--count", BRANCH).strip() == "8"
    assert len(argocd.calls) == 8
    assert {c.container_id for c in agents[0].list_containers()} == {mf.workload_id(f"key-{i}") for i in range(8)}


def test_existing_branch_content_is_kept(bare, argocd, tmp_path):
    seed = tmp_path / "seed"
    subprocess.run(["git", "clone", "-q", str(bare), str(seed)], check=True)
    (seed / "README.md").write_text("ops repo\n")
    for args in (["add", "README.md"], ["-c", "user.name=o", "-c", "user.email=o@x", "commit", "-qm", "init"]):
        subprocess.run(["git", "-C", str(seed), *args], check=True)
    subprocess.run(["git", "-C", str(seed), "push", "-q", "origin", f"HEAD:{BRANCH}"], check=True)

    make_executor(bare, argocd, tmp_path / "w").execute("container.create", web(), command_key="k", progress=quiet)
    assert tree(bare) == ["README.md", "manifests/web.yaml"]


def test_same_name_for_another_key_is_a_conflict(executor):
    executor.execute("container.create", web(), command_key="k1", progress=quiet)
    with pytest.raises(CommandFailed) as err:
        executor.execute("container.create", web(), command_key="k2", progress=quiet)
    assert err.value.code == "conflict"


def test_sync_failures_are_argocd_sync_failed_and_a_redelivery_syncs_again(executor, bare, argocd):
    argocd.fail_with(500)
    with pytest.raises(CommandFailed) as err:
        executor.execute("container.create", web(), command_key="k1", progress=quiet)
    assert err.value.code == "argocd_sync_failed"
    assert "500" in err.value.message
    assert tree(bare) == ["manifests/web.yaml"]  # the commit is in; only the sync failed

    argocd.fail_with(None)
    assert executor.execute("container.create", web(), command_key="k1", progress=quiet).existed is True
    assert len(argocd.calls) == 2


def test_wrong_token_or_unknown_app_or_dead_server(bare, argocd, tmp_path):
    for overrides in ({"token": "wrong"}, {"app_name": "nope"}, {"server": f"http://127.0.0.1:{free_port()}"}):
        ex = make_executor(bare, argocd, tmp_path / str(len(argocd.calls)), **overrides)
        with pytest.raises(CommandFailed) as err:
            ex.execute("container.create", web(), command_key="k", progress=quiet)
        assert err.value.code == "argocd_sync_failed"


def test_unreachable_repository_is_gitops_failed(argocd, tmp_path):
    ex = make_executor(tmp_path / "missing.git", argocd, tmp_path / "w")
    with pytest.raises(CommandFailed) as err:
        ex.execute("container.create", web(), command_key="k", progress=quiet)
    assert err.value.code == "gitops_failed"
    assert argocd.calls == []


def test_a_rejected_push_is_reapplied_on_the_new_head(bare, argocd, tmp_path):
    first = make_executor(bare, argocd, tmp_path / "a")
    other = make_executor(bare, argocd, tmp_path / "b")
    messages: list[str] = []

    def progress(message: str, *_args: object, **_kwargs: object) -> None:
        messages.append(message)
        if message.startswith("committed") and len(messages) < 3:
            # Someone else pushes between our commit and our push: ours is rejected once.
            other.execute("container.create", web("intruder"), command_key="other", progress=quiet)

    first.execute("container.create", web("mine"), command_key="mine", progress=progress)

    assert any("rejected" in m for m in messages)
    assert tree(bare) == ["manifests/intruder.yaml", "manifests/mine.yaml"]
    assert git(bare, "rev-list", "--count", BRANCH).strip() == "2"


def test_registry_credentials_are_never_committed(executor, bare):
    spec = web(registry_username="robot", registry_password="pw")
    with pytest.raises(CommandFailed) as err:
        executor.execute("container.create", spec, command_key="k", progress=quiet)
    assert err.value.code == "unsupported"
    assert "pw" not in err.value.message
    with pytest.raises(subprocess.CalledProcessError):
        tree(bare)  # nothing was pushed at all
