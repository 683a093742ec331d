"""`ctfleet` with a real agent: a join token from the CLI joins a node, `get nodes` lists it, `run --wait`
downloads a model (and a failing command exits 1), `events` shows the node's log, the endpoint example is
applied with --wait (twice: the second changes nothing), `endpoint chat` streams through the tunnel,
`logs` shows the endpoint's events, usage comes out as CSV, cordon/uncordon/drain change the node, and
`get nodes --watch` prints the node going offline when its agent is killed, and a command for the offline
node times out with exit 5."""

from __future__ import annotations

import csv
import io
import json
import re
import sys

import pytest

from fleet.models import Node
from fleet.workloads.models import Endpoint
from tests.support.live import agent_join, agent_run, stop_endpoint_servers
from tests.support.processes import REPO_ROOT, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_node_joined_run_watched_and_an_endpoint_applied_and_invoked(
    control_plane, cluster, operator, api_key, hub, ctfleet, tmp_path
):
    _, raw = api_key
    ctfleet.env.update({"CTFLEET_URL": control_plane.url, "CTFLEET_API_KEY": raw})  # no config file: a CI job

    ran = ctfleet("join-token", "lab")
    assert ran.code == 0, ran
    token = re.search(r"CLUSTER_TOKEN=(\S+) sh", ran.out).group(1)
    state = tmp_path / "state"
    joined = agent_join(control_plane.url, token, state)
    assert joined.returncode == 0, joined.stderr
    env = {
        "CLEVERTHIS_MODEL_CACHE": str(tmp_path / "models"),
        "HF_ENDPOINT": hub.url,
        "CLEVERTHIS_ENDPOINT_SERVER": f"{sys.executable} -m tests.support.openai_standin",
    }
    agent = agent_run(state, tmp_path, env=env)
    watcher = None
    try:
        wait_until(lambda: Node.objects.filter(cluster=cluster, status="online").exists(), timeout=60, what="online")
        node = Node.objects.get(cluster=cluster)

        ran = ctfleet("get", "nodes")
        assert ran.code == 0, ran
        assert ran.out.splitlines()[1].split()[:3] == [node.name, "online", "yes"]

        ran = ctfleet("run", "lab", "model.download", "--node", node.name, "-p", "model_id=acme/tiny", "--wait")
        assert ran.code == 0, ran
        assert re.search(rf"{node.name}\s+model.download\s+succeeded", ran.out), ran.out
        ran = ctfleet("run", "lab", "model.download", "-p", "model_id=acme/tiny", "--wait", "-o", "json")
        assert ran.code == 0, ran  # no --node: every online node of the cluster (here the one)
        assert [(c["node_name"], c["status"]) for c in json.loads(ran.out)] == [(node.name, "succeeded")]
        ran = ctfleet("run", "lab", "model.download", "--node", node.name, "-p", "model_id=acme/absent", "--wait")
        assert ran.code == 1, ran
        assert "failed" in ran.out

        ran = ctfleet("events", node.name, "--tail", "100")
        assert ran.code == 0, ran
        assert "connected" in ran.out
        ran = ctfleet("events", node.name, "-f", "--interval", "0.2", "--follow-timeout", "1")  # follows, then ends
        assert ran.code == 0, ran
        assert len(ran.out.splitlines()) == len(set(ran.out.splitlines())) > 0  # each event printed once

        endpoint_file = str(REPO_ROOT / "examples" / "endpoint.yaml")
        ran = ctfleet("apply", "-f", endpoint_file, "--yes", "--wait", "--timeout", "120")
        assert ran.code == 0, ran
        assert "+ Endpoint acme/tiny on lab: create" in ran.out
        assert "Endpoint acme/tiny on lab: running" in ran.out
        ran = ctfleet("apply", "-f", endpoint_file, "--yes")
        assert ran.code == 0, ran
        assert "= Endpoint acme/tiny on lab: unchanged" in ran.out
        assert Endpoint.objects.filter(cluster=cluster).count() == 1
        endpoint = Endpoint.objects.get(cluster=cluster)

        ran = ctfleet("endpoint", "chat", endpoint.slug, "-m", "hello tunnel world", "--connect-to", control_plane.url)
        assert ran.code == 0, ran
        assert ran.out.strip() == "echo: hello tunnel world"
        ran = ctfleet(
            "endpoint", "invoke", endpoint.slug, "--path", "v1/models", "--no-stream", "--connect-to", control_plane.url
        )
        assert ran.code == 0, ran
        assert json.loads(ran.out)["data"][0]["id"] == "acme/tiny"

        ran = ctfleet("logs", "endpoint", endpoint.slug)
        assert ran.code == 0, ran
        assert ran.out.strip(), ran

        def usage_rows():
            out = ctfleet("usage", "--period", "1h").out
            return list(csv.DictReader(io.StringIO(out)))

        wait_until(lambda: any(r["name"] and int(r["requests"]) >= 2 for r in usage_rows()), timeout=30, what="usage")

        # a field that can change in place rolls the endpoint over; one that cannot is refused, nothing sent
        changed = tmp_path / "endpoint.yaml"
        changed.write_text(
            (REPO_ROOT / "examples" / "endpoint.yaml").read_text() + '  server_args: ["--max-model-len", "96"]\n'
        )
        ran = ctfleet("apply", "-f", str(changed), "--yes")
        assert ran.code == 0, ran
        assert "~ Endpoint acme/tiny on lab: update (server_args: [] → ['--max-model-len', '96'])" in ran.out
        assert Endpoint.objects.get(pk=endpoint.pk).server_args == ["--max-model-len", "96"]
        assert "unchanged" in ctfleet("apply", "-f", str(changed), "--yes").out
        fixed = tmp_path / "gpus.yaml"
        fixed.write_text(changed.read_text().replace("min_replicas: 1", "min_replicas: 1\n  gpus: 1"))
        ran = ctfleet("apply", "-f", str(fixed), "--yes")
        assert ran.code == 2, ran
        assert "! Endpoint acme/tiny on lab: refused — cannot change in place: gpus (0 → 1)" in ran.out

        ran = ctfleet("delete", "-f", endpoint_file, "--yes")
        assert ran.code == 0, ran
        assert Endpoint.objects.get(pk=endpoint.pk).status in ("stopping", "stopped")

        assert ctfleet("cordon", node.name).code == 0
        assert Node.objects.get(pk=node.pk).status == "cordoned"
        assert ctfleet("uncordon", node.name).code == 0
        assert Node.objects.get(pk=node.pk).status == "online"
        ran = ctfleet("drain", node.name)
        assert ran.code == 0, ran
        assert Node.objects.get(pk=node.pk).status in ("draining", "cordoned")
        wait_until(lambda: Node.objects.get(pk=node.pk).status == "cordoned", timeout=30, what="drained")
        assert ctfleet("uncordon", node.name).code == 0

        log = tmp_path / "watch.log"
        watcher = ctfleet.popen("get", "nodes", "--watch", "--interval", "0.5", "--watch-timeout", "120", log=log)
        wait_until(lambda: node.name in log.read_text(), timeout=30, what="the watch's first rows")
        agent.kill()
        wait_until(
            lambda: re.search(rf"{node.name}\s+offline", log.read_text()), timeout=60, what="the watch seeing offline"
        )

        # a command for the offline node stays queued: --wait gives up with exit 5 and says what it waited for
        ran = ctfleet(
            "run", "lab", "model.download", "--node", node.name, "-p", "model_id=acme/tiny", "--wait", "--timeout", "2"
        )
        assert ran.code == 5, ran
        assert re.search(r"Timed out after 2 s waiting for command \S+ \(now queued\)", ran.err), ran.err
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
            watcher.wait(10)
        agent.stop()
        stop_endpoint_servers(state)
