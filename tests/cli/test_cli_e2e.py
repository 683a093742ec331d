"""`ctfleet` end to end against a real control plane (uvicorn + Celery + PostgreSQL + Redis), run as the
installed command: sign-in and its config file, the examples applied (twice: the second changes nothing),
a quota's 409 shown as the server's sentence, get/describe in every format, delete, keys refused with a key,
a revoked key, and the exit codes scripts rely on."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ctfleet import Client, errors

from fleet.models import ComputeCluster
from fleet.workloads import services as workload_services
from raymgr.models import RayCluster
from raymgr.workloads.models import ServeDeployment, TrainingJob, TuneExperiment
from tenancy.models import WorkspaceQuota
from tests.support.processes import REPO_ROOT, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

EXAMPLES = REPO_ROOT / "examples"


def test_login_apply_twice_quota_refusal_get_delete_and_a_revoked_key(
    control_plane, operator, api_key, ctfleet, tmp_path
):
    user, workspace = operator
    key, raw = api_key

    # the models regenerated from the schema the running server publishes are the checked-in ones
    generated = subprocess.run(
        [sys.executable, "-m", "ctfleet.codegen", "--url", control_plane.url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert generated.returncode == 0, generated.stderr
    assert generated.stdout == (REPO_ROOT / "client" / "ctfleet" / "models.py").read_text()

    # not signed in yet: exit 7 and the fix
    ran = ctfleet("get", "nodes")
    assert ran.code == 7, ran
    assert "ctfleet login" in ran.err

    ran = ctfleet("login", "--url", control_plane.url, env={"CTFLEET_API_KEY": raw})
    assert ran.code == 0, ran
    config = ctfleet.home / ".config" / "ctfleet" / "config.yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert yaml.safe_load(config.read_text())["profiles"]["default"] == {"url": control_plane.url, "api_key": raw}

    ran = ctfleet("whoami")
    assert ran.code == 0, ran
    assert f"Workspace:  {workspace.slug}" in ran.out
    assert "Key:        cli" in ran.out

    # a wrong key at login is refused and nothing is saved over the good one
    ran = ctfleet("login", "--url", control_plane.url, "--profile", "bad", env={"CTFLEET_API_KEY": "ctk_nope"})
    assert ran.code == 7, ran
    assert "Invalid, expired or revoked API key." in ran.err
    assert "bad" not in yaml.safe_load(config.read_text())["profiles"]

    # the plan, a dry run, then the examples applied
    names = ("cluster", "quota", "raycluster", "trainingjob", "tuneexperiment", "servedeployment")
    files = [str(EXAMPLES / f"{n}.yaml") for n in names]
    args = [a for f in files for a in ("-f", f)]
    ran = ctfleet("apply", *args, "--dry-run")
    assert ran.code == 0, ran
    assert "+ Cluster lab: create" in ran.out
    assert "Dry run: 6 change(s) not made." in ran.out
    assert not ComputeCluster.objects.filter(workspace=workspace).exists()

    ran = ctfleet("apply", *args)  # no terminal and no --yes: refused before any change
    assert ran.code == 2, ran
    assert "--yes" in ran.err

    ran = ctfleet("apply", *args, "--yes")
    assert ran.code == 0, ran
    lab = ComputeCluster.objects.get(workspace=workspace, name="lab")
    assert lab.description == "GPU workstations in the lab"
    quota = WorkspaceQuota.objects.get(workspace=workspace)
    assert (quota.gpus, quota.endpoints, quota.ray_clusters) == (8, 4, 2)
    assert RayCluster.objects.filter(workspace=workspace, name="train").count() == 1
    assert TrainingJob.objects.get(name="hello").ray_cluster.name == "train"

    # the second run (the same files, as a folder) changes nothing and says so
    folder = tmp_path / "manifests"
    folder.mkdir()
    for path in files:
        (folder / Path(path).name).write_text(Path(path).read_text())
    ran = ctfleet("apply", "-f", str(folder), "--yes")
    assert ran.code == 0, ran
    assert "Nothing to change." in ran.out
    assert [line.split(": ")[1].split(" ")[0] for line in ran.out.splitlines()[:6]] == ["unchanged"] * 6, ran.out
    assert ComputeCluster.objects.filter(workspace=workspace).count() == 1
    assert RayCluster.objects.filter(workspace=workspace).count() == 1
    assert TrainingJob.objects.filter(name="hello").count() == 1
    assert TuneExperiment.objects.get(name="lr-sweep").status == "queued"
    assert ServeDeployment.objects.get(name="echo").ray_cluster.name == "train"

    # an in-place change is an update of that field only
    changed = tmp_path / "cluster.yaml"
    changed.write_text((EXAMPLES / "cluster.yaml").read_text().replace("in the lab", "in room 2"))
    ran = ctfleet("apply", "-f", str(changed), "--yes")
    assert ran.code == 0, ran
    assert "~ Cluster lab: update (description: GPU workstations in the lab → GPU workstations in room 2)" in ran.out
    assert ComputeCluster.objects.get(pk=lab.pk).description == "GPU workstations in room 2"

    # a manifest that does not validate: exit 2 naming every problem, nothing sent
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Endpoint\nspec: {cluster: lab, gpus: two, colour: red}\n")
    ran = ctfleet("apply", "-f", str(bad), "--yes")
    assert ran.code == 2, ran
    assert "spec.gpus must be int" in ran.err
    assert "unknown spec field 'colour'" in ran.err
    assert "Endpoint needs spec.model_id" in ran.err

    # a quota refusal: the server's sentence, exit 4
    second = tmp_path / "second.yaml"
    second.write_text(
        "kind: Quota\nspec: {ray_clusters: 1}\n---\n"
        "kind: RayCluster\nmetadata: {name: second}\nspec: {compute_cluster: lab, runtime: process}\n"
    )
    ran = ctfleet("apply", "-f", str(second), "--yes")
    assert ran.code == 4, ran
    assert "Ray clusters" in ran.err, ran.err
    assert "(quota ray_clusters: limit 1, in use 1, asked 1)" in ran.err, ran.err
    assert not RayCluster.objects.filter(name="second").exists()

    # the same through the SDK: typed models, the 409 typed with the server's JSON, an event log followed
    train = RayCluster.objects.get(workspace=workspace, name="train")
    with Client(control_plane.url, raw) as sdk:
        assert [w.slug for w in sdk.workspaces()] == [workspace.slug]
        assert {line.quota: line.limit for line in sdk.quotas(str(workspace.pk)).quotas}["ray_clusters"] == 1
        body = {"workspace": str(workspace.pk), "compute_cluster": str(lab.pk), "name": "third", "runtime": "process"}
        with pytest.raises(errors.Conflict) as caught:
            sdk.post("api/v1/ray/clusters/", body)
        assert caught.value.status == 409
        assert (caught.value["quota"], caught.value["limit"], caught.value["asked"]) == ("ray_clusters", 1, 1)
        assert caught.value.message == caught.value["detail"]
        events = list(sdk.follow_events(f"api/v1/ray/clusters/{train.pk}/events/"))
        assert events[0]["kind"] == "created"

    # get in every format
    ran = ctfleet("get", "clusters")
    assert ran.code == 0, ran
    header, row = ran.out.splitlines()[:2]
    assert header.split() == ["NAME", "MODE", "NODE_COUNT", "ID"]
    assert row.split() == ["lab", "standalone", "0", str(lab.pk)]
    assert json.loads(ctfleet("get", "clusters", "-o", "json").out)[0]["name"] == "lab"
    assert yaml.safe_load(ctfleet("get", "cluster", "lab", "-o", "yaml").out)["id"] == str(lab.pk)
    quotas = json.loads(ctfleet("get", "quotas", "-o", "json").out)
    assert {q["quota"]: q["limit"] for q in quotas}["ray_clusters"] == 1
    ran = ctfleet("describe", "raycluster", "train")
    assert ran.code == 0, ran
    assert "name: train" in ran.out
    assert "events:" in ran.out

    # the Ray Dashboard's link (through the control plane's ticket flow); a script submitted to a Ray cluster
    ran = ctfleet("ray", "dashboard", "train")
    assert ran.code == 0, ran
    assert ran.out.strip() == f"{control_plane.url}/ray/clusters/{train.pk}/dashboard/"
    script = tmp_path / "hello_train.py"
    script.write_text("print('hello from ray')\n")
    ran = ctfleet("ray", "submit", str(script), "--cluster", "train", "--no-follow")
    assert ran.code == 0, ran
    job = TrainingJob.objects.get(ray_cluster=train, name="hello-train")
    assert "hello from ray" in job.script
    assert f"training job hello-train ({job.pk}): queued" in ran.err
    ran = ctfleet("get", "trainingjobs", "-l", "status=queued")
    assert sorted(line.split()[0] for line in ran.out.splitlines()[1:]) == ["hello", "hello-train"]
    ran = ctfleet("logs", "trainingjob", "hello-train")  # nothing logged yet, and not following: exit 0
    assert ran.code == 0, ran
    ran = ctfleet("logs", "trainingjob", "hello-train", "-f", "--interval", "0.2", "--follow-timeout", "1")
    assert ran.code == 0, ran
    ran = ctfleet("logs", "raycluster", "train")
    assert "created" in ran.out

    # every resource lists, in JSON
    for name in (
        "workspaces",
        "clusters",
        "nodes",
        "commands",
        "containers",
        "endpoints",
        "rayclusters",
        "trainingjobs",
        "tuneexperiments",
        "servedeployments",
        "apikeys",
        "quotas",
        "usage",
    ):
        ran = ctfleet("get", name, "-o", "json")
        assert ran.code == 0, (name, ran)
        assert isinstance(json.loads(ran.out), list), name

    # not found: exit 3
    ran = ctfleet("get", "cluster", "nope")
    assert ran.code == 3, ran
    assert "No cluster 'nope'." in ran.err

    # keys: listed with a key; minting one with a key is refused, with why and where to do it instead
    listed = json.loads(ctfleet("keys", "list", "-o", "json").out)
    assert [k["name"] for k in listed] == ["cli"]
    ran = ctfleet("keys", "create", "ci")
    assert ran.code == 4, ran
    assert "cannot mint or revoke keys" in ran.err
    assert "API keys are managed while signed in, not with an API key." in ran.err
    ran = ctfleet("keys", "revoke", str(key.pk))
    assert ran.code == 4, ran
    assert "cannot mint or revoke keys" in ran.err

    # delete: the job is cancelled, the Ray cluster and the cluster go; a second delete finds them absent
    for name in ("trainingjob", "tuneexperiment", "servedeployment"):
        ran = ctfleet("delete", "-f", str(EXAMPLES / f"{name}.yaml"), "--yes")
        assert ran.code == 0, ran
    assert TrainingJob.objects.get(name="hello").status == "cancelled"
    assert TuneExperiment.objects.get(name="lr-sweep").status == "cancelled"
    assert ServeDeployment.objects.get(name="echo").status in ("stopping", "stopped")
    ran = ctfleet("delete", "-f", str(EXAMPLES / "raycluster.yaml"), "--yes")
    assert ran.code == 0, ran
    assert "- RayCluster train: delete" in ran.out
    ran = ctfleet("delete", "-f", str(EXAMPLES / "raycluster.yaml"), "--yes")
    assert ran.code == 0, ran
    assert "RayCluster train: absent" in ran.out
    ran = ctfleet("delete", "-f", str(EXAMPLES / "cluster.yaml"), "--yes")
    assert ran.code == 0, ran
    assert not ComputeCluster.objects.filter(pk=lab.pk).exists()

    # a revoked key: exit 7, the server's sentence
    # (every replica refuses it within API_KEY_CACHE_S: the web process may still hold the grant a moment)
    workload_services.api_key_revoke(actor=user, key=key)
    wait_until(lambda: ctfleet("get", "nodes").code == 7, timeout=15, what="the revoked key refused")
    ran = ctfleet("get", "nodes")
    assert ran.code == 7, ran
    assert "Invalid, expired or revoked API key." in ran.err
    assert "Create a key on the Settings → API keys page" in ran.err
