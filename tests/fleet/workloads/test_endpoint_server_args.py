"""An endpoint's server arguments: validated strictly (a list of strings, bounded, never a flag the agent
sets itself), carried by every replica's endpoint.start (create, restart, healing, the autoscaler, a rolling
update), changed by a rolling update (service, API `update/`, the Endpoints page) and by a start from the
Commands tab; refusals write nothing."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from agent import protocol
from agent.workloads.endpoints import server_argv
from agent.workloads.engine import Engine
from audit.models import AuditEntry
from fleet.models import Command, Node, NodeEvent, NodeStatus
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointEvent, EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_heal_tick
from kernel.exceptions import IllegalTransition
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

TINY = protocol.CachedModel(model_id="acme/tiny", revision="main", path="/cache/main", size_bytes=5)
V2 = protocol.CachedModel(model_id="acme/tiny", revision="v2", path="/cache/v2", size_bytes=5)
ARGS = ["--max-model-len", "2048"]


def starts(endpoint) -> list[Command]:
    return [r.start_command for r in endpoint.replicas.order_by("created_at", "server_id")]


@pytest.fixture
def nodes(cluster, register_node):
    made = [register_node(cluster, name) for name in ("a", "b", "c")]
    for node in made:
        agent_side.inventory(node, models=[TINY, V2])
    return made


@pytest.fixture
def running(nodes, cluster, owner):
    endpoint = workloads.endpoint_create(
        actor=owner, cluster=cluster, model_id="acme/tiny", min_replicas=2, server_args=ARGS
    )
    for port, replica in enumerate(EndpointReplica.objects.filter(endpoint=endpoint), start=8001):
        agent_side.result(replica.start_command, port=port)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    return endpoint


# ---- validation


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ([], []),
        (["--max-model-len", "2048"], ["--max-model-len", "2048"]),
        (["--max-model-len 2048"], ["--max-model-len", "2048"]),  # option and value in one item
        (["--max-model-len=2048", "--enforce-eager"], ["--max-model-len=2048", "--enforce-eager"]),
        (
            ['--override-generation-config {"temperature": 0.5}'],
            ["--override-generation-config", '{"temperature": 0.5}'],
        ),
        (["--chat-template", "{{ a b }}"], ["--chat-template", "{{ a b }}"]),  # a value keeps its spaces
        (["--dtype", "half"], ["--dtype", "half"]),  # the device defaults may be overridden
    ],
)
def test_valid_server_args_are_kept_as_vllm_takes_them(given, kept):
    assert workloads.validate_server_args(given) == kept


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--port", "9000"], "--port is set by the agent itself (the agent picks the server's port)"),
        (["--port=9000"], "--port is set by the agent itself"),
        (["--host 0.0.0.0"], "--host is set by the agent itself"),
        (["--model", "/x"], "--model is set by the agent itself"),
        (["--served-model-name", "x"], "--served-model-name is set by the agent itself"),
        (["--served_model_name", "x"], "'--served_model_name' (read by vLLM as --served-model-name)"),
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size is set by the agent itself"),
        (["-tp", "2"], "-tp is set by the agent itself"),
        (["--por", "1"], "'--por' (read by vLLM as --port)"),
        (["--config", "x.yaml"], "--config is set by the agent itself"),
        (["--uds", "/tmp/s"], "--uds is set by the agent itself"),
    ],
)
def test_flags_the_agent_sets_are_refused_by_name(given, said):
    with pytest.raises(ValidationError) as exc:
        workloads.validate_server_args(given)
    (message,) = exc.value.message_dict["server_args"]
    assert said in message
    assert message.endswith("leave it out.")


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("--max-model-len 2048", "Must be a list of strings"),
        (["--max-model-len", 2048], "Must be a list of strings"),
        ({"--max-model-len": "2048"}, "Must be a list of strings"),
        (["-x"] * 65, "At most 64 arguments (got 65)."),
        (["-x 1"] * 33, "At most 64 arguments (got 66)."),  # counted once split
        (["-x"] * 100_000, "At most 64 arguments (got 100000)."),
        (["--a", "x" * 501], "at most 500 characters per argument"),
        (["--a", "b\x00c"], "cannot hold a NUL character"),
    ],
)
def test_malformed_server_args_are_refused(given, said):
    with pytest.raises(ValidationError) as exc:
        workloads.validate_server_args(given)
    assert any(said in m for m in exc.value.message_dict["server_args"])


def test_every_flag_the_agent_sets_on_the_server_is_refused():
    """The refused list follows the agent's real command line (GPUs > 1: the tensor parallel size too)."""
    payload = protocol.EndpointStartPayload(endpoint_id="a" * 12, model_id="acme/tiny", gpus=2, extra_args=["--x"])
    argv = server_argv(Engine(["vllm-server"], "gpu"), Path("/cache/m"), 8000, payload)
    defaults = Engine(["vllm-server"], "gpu").args()  # the device's defaults, which an endpoint may override
    own = [a for a in argv[1:-1] if a.startswith("-") and a not in defaults]
    assert own == ["--model", "--port", "--served-model-name", "--host", "--tensor-parallel-size"]
    assert all(protocol.endpoint_arg_reserved(flag) == flag for flag in own)
    assert argv[-1] == "--x"  # the endpoint's own arguments come last (a later flag wins in vLLM)


# ---- every replica's start carries the endpoint's arguments


def test_create_stores_the_args_and_every_replica_starts_with_them(running, owner):
    assert running.server_args == ARGS
    assert [c.payload["extra_args"] for c in starts(running)] == [ARGS, ARGS]
    entry = AuditEntry.objects.get(action="endpoint.create")
    assert entry.detail["server_args"] == ARGS


def test_create_refuses_bad_args_and_writes_nothing(nodes, cluster, owner):
    with pytest.raises(ValidationError) as exc:
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/tiny", server_args=["--port", "1"])
    assert "--port" in exc.value.message_dict["server_args"][0]
    assert not Endpoint.objects.exists()
    assert not Command.objects.filter(command_type="endpoint.start").exists()


def test_healing_restart_and_the_autoscaler_start_replicas_with_the_args(running, nodes, owner):
    lost = EndpointReplica.objects.filter(endpoint=running).first()
    Node.objects.filter(pk=lost.node_id).update(status=NodeStatus.OFFLINE)
    assert endpoints_heal_tick() == {str(running.pk): 1}
    healed = EndpointReplica.objects.get(replacement_of=lost)
    assert healed.start_command.payload["extra_args"] == ARGS

    Endpoint.objects.filter(pk=running.pk).update(max_replicas=3, target_requests_per_min=1, scale_cooldown_s=0)
    t0 = timezone.now()
    workloads.endpoint_autoscale(endpoint_id=running.pk, now=t0)
    Endpoint.objects.filter(pk=running.pk).update(request_count=1000)
    up = workloads.endpoint_autoscale(endpoint_id=running.pk, now=t0 + timedelta(minutes=1))
    assert up.changed == 1, up.reason
    added = EndpointReplica.objects.filter(endpoint=running, replacement_of__isnull=True).order_by("-created_at")[0]
    assert added.start_command.payload["extra_args"] == ARGS

    Node.objects.filter(pk=lost.node_id).update(status=NodeStatus.ONLINE)
    workloads.endpoint_stop(actor=owner, endpoint=running)
    for replica in EndpointReplica.objects.filter(endpoint=running, status=EndpointStatus.STOPPING):
        agent_side.result(replica.stop_command)
    workloads.endpoint_restart(actor=owner, endpoint=Endpoint.objects.get(pk=running.pk))
    pending = EndpointReplica.objects.filter(endpoint=running, status=EndpointStatus.PENDING)
    assert pending.exists()
    assert all(r.start_command.payload["extra_args"] == ARGS for r in pending)


# ---- rolling update


def test_an_args_only_update_rolls_every_replica_over(running, owner, settings):
    settings.ENDPOINT_DRAIN_S = 0
    olds = list(EndpointReplica.objects.filter(endpoint=running))
    endpoint = workloads.endpoint_update(actor=owner, endpoint=running, server_args=["--max-model-len 4096"])
    assert (endpoint.revision, endpoint.server_args) == ("main", ["--max-model-len", "4096"])
    news = [EndpointReplica.objects.get(replacement_of=old) for old in olds]
    assert [(n.start_command.payload["revision"], n.start_command.payload["extra_args"]) for n in news] == [
        ("main", ["--max-model-len", "4096"])
    ] * 2
    endpoints_heal_tick()  # the old ones serve until their replacements run
    assert all(EndpointReplica.objects.get(pk=o.pk).status == EndpointStatus.RUNNING for o in olds)
    for port, new in enumerate(news, start=9001):
        agent_side.result(new.start_command, port=port)
    endpoints_heal_tick()
    assert all(EndpointReplica.objects.get(pk=o.pk).status == EndpointStatus.STOPPING for o in olds)
    event = NodeEvent.objects.filter(kind="endpoint.updating").first()
    assert "server arguments --max-model-len 2048 → --max-model-len 4096" in event.message
    logged = EndpointEvent.objects.filter(endpoint=endpoint, kind="endpoint.updating")
    assert logged.count() == 2
    assert logged.first().data["server_args"] == {"old": ARGS, "new": ["--max-model-len", "4096"]}
    entry = AuditEntry.objects.get(action="endpoint.update")
    assert entry.detail == {
        "revision": {"old": "main", "new": "main"},
        "server_args": {"old": ARGS, "new": ["--max-model-len", "4096"]},
    }


def test_revision_and_args_together_and_the_revision_alone_keeps_the_args(running, owner):
    endpoint = workloads.endpoint_update(actor=owner, endpoint=running, revision="v2", server_args=[])
    assert (endpoint.revision, endpoint.server_args) == ("v2", [])
    new = EndpointReplica.objects.filter(endpoint=running, replacement_of__isnull=False).first()
    assert (new.start_command.payload["revision"], new.start_command.payload["extra_args"]) == ("v2", [])


def test_nothing_to_change_and_not_running_are_409s_and_bad_input_400s(running, owner):
    before = Command.objects.filter(command_type="endpoint.start").count()
    with pytest.raises(IllegalTransition, match="already"):
        workloads.endpoint_update(actor=owner, endpoint=running, server_args=["--max-model-len", "2048"])
    with pytest.raises(IllegalTransition, match="already"):
        workloads.endpoint_update(actor=owner, endpoint=running, revision="main", server_args=["--max-model-len 2048"])
    with pytest.raises(ValidationError) as exc:
        workloads.endpoint_update(actor=owner, endpoint=running)
    assert "revision" in exc.value.message_dict
    with pytest.raises(ValidationError) as exc:
        workloads.endpoint_update(actor=owner, endpoint=running, server_args=["--host", "0.0.0.0"])
    assert "--host" in exc.value.message_dict["server_args"][0]
    assert Command.objects.filter(command_type="endpoint.start").count() == before
    refused = AuditEntry.objects.filter(action="endpoint.update", outcome="refused")
    assert refused.count() == 4
    workloads.endpoint_stop(actor=owner, endpoint=running)
    with pytest.raises(IllegalTransition, match="only a running one"):
        workloads.endpoint_update(actor=owner, endpoint=running, server_args=["--max-model-len", "1"])
    running.refresh_from_db()
    assert running.server_args == ARGS


# ---- API


def test_api_creates_with_args_and_lists_them(nodes, cluster, owner, api_client_for):
    client = api_client_for(owner)
    made = client.post(
        "/api/v1/endpoints/",
        {"cluster": str(cluster.pk), "model_id": "acme/tiny", "server_args": ["--max-model-len 512"]},
        format="json",
    )
    assert made.status_code == 201, made.content
    assert made.json()["server_args"] == ["--max-model-len", "512"]
    assert Endpoint.objects.get().start_command.payload["extra_args"] == ["--max-model-len", "512"]
    for bad, said in (("--max-model-len 512", "Must be a list of strings"), (["--port", "1"], "--port is set by")):
        refused = client.post(
            "/api/v1/endpoints/",
            {"cluster": str(cluster.pk), "model_id": "acme/tiny", "server_args": bad},
            format="json",
        )
        assert refused.status_code == 400
        assert said in refused.json()["server_args"][0]
    assert Endpoint.objects.count() == 1


# The flags the hostile probe got accepted (201, and a server started): each refused by name, nothing written.
HOSTILE = [
    (["--trust-remote-code"], "--trust-remote-code is refused: it runs the model repository's Python code"),
    (["--chat-template", "/etc/hostname"], "--chat-template '/etc/hostname': must be an inline Jinja template"),
    (["--allowed-local-media-path", "/"], "--allowed-local-media-path is refused: it serves the node's files"),
    (["--tool-parser-plugin", "/tmp/plugin.py"], "--tool-parser-plugin is refused: it runs Python code"),
    (["--otlp-traces-endpoint", "http://10.0.0.9:4317"], "--otlp-traces-endpoint is refused"),
    (["--middleware", "os.system"], "--middleware is refused"),
    (["--worker-cls", "evil.Worker"], "--worker-cls is refused"),
    (["--lora-modules", "a=/etc"], "--lora-modules is refused"),
    (["--generation-config", "/etc"], "--generation-config is refused"),
    (["--tokenizer", "/etc"], "--tokenizer is refused"),
    (["--max-model-len", "2048", "--brand-new-flag"], "--brand-new-flag is not a server flag an endpoint may set"),
    (["--gpu-memory-utilization", "7"], "--gpu-memory-utilization '7': must be a number from 0.05 to 1"),
]


@pytest.mark.parametrize(("bad", "said"), HOSTILE)
def test_api_refuses_server_args_outside_the_allow_list_by_name(nodes, cluster, owner, api_client_for, bad, said):
    client = api_client_for(owner)
    refused = client.post(
        "/api/v1/endpoints/", {"cluster": str(cluster.pk), "model_id": "acme/tiny", "server_args": bad}, format="json"
    )
    assert refused.status_code == 400, refused.content
    (message,) = refused.json()["server_args"]
    assert said in message
    assert not Endpoint.objects.exists()
    assert not Command.objects.exists()


@pytest.mark.parametrize(("bad", "said"), HOSTILE[:4])
def test_a_raw_endpoint_start_and_an_update_refuse_them_too(running, owner, api_client_for, bad, said):
    client = api_client_for(owner)
    raw = client.post(
        f"/api/v1/clusters/{running.cluster_id}/commands/",
        {
            "command_type": "endpoint.start",
            "node_id": str(running.replicas.first().node_id),
            "payload": {"model_id": "acme/tiny", "extra_args": bad},
        },
        format="json",
    )
    assert raw.status_code == 400, raw.content
    assert said in str(raw.json())
    update = client.post(f"/api/v1/endpoints/{running.pk}/update/", {"server_args": bad}, format="json")
    assert update.status_code == 400, update.content
    assert said in update.json()["server_args"][0]
    assert Endpoint.objects.count() == 1
    running.refresh_from_db()
    assert running.server_args == ARGS


def test_api_update(running, owner, api_client_for):
    client = api_client_for(owner)
    url = f"/api/v1/endpoints/{running.pk}/update/"
    for body, field, said in (
        ({}, "revision", "Give a revision and/or server_args"),
        ({"server_args": "--max-model-len 1"}, "server_args", "Must be a list of strings"),
        ({"server_args": ["--model", "x"]}, "server_args", "--model is set by the agent itself"),
        ({"revision": "../x"}, "revision", "Not a valid revision"),
        ({"server_args": [], "replicas": 3}, "replicas", "Unknown field."),
    ):
        refused = client.post(url, body, format="json")
        assert refused.status_code == 400, refused.content
        assert said in str(refused.json()[field])
    same = client.post(url, {"server_args": ARGS}, format="json")
    assert same.status_code == 409
    assert "already" in same.json()["detail"]
    done = client.post(url, {"server_args": ["--max-model-len", "4096"]}, format="json")
    assert done.status_code == 200, done.content
    body = done.json()
    assert (body["revision"], body["server_args"]) == ("main", ["--max-model-len", "4096"])
    assert sum(1 for r in body["replicas"] if r["replacement_of"]) == 2
    legacy = client.post(f"/api/v1/endpoints/{running.pk}/update_revision/", {"revision": "v2"}, format="json")
    assert legacy.status_code == 200, legacy.content
    assert (legacy.json()["revision"], legacy.json()["server_args"]) == ("v2", ["--max-model-len", "4096"])


def test_viewers_cannot_update(running, workspace, member_of, api_client_for, client):
    """(Members may: tests/tenancy/test_role_rights.py.)"""
    user = member_of(workspace, "viewer")
    api = api_client_for(user)
    for url, body in (("update/", {"server_args": ["--port", "1"]}), ("update_revision/", {"revision": "v2"})):
        answer = api.post(f"/api/v1/endpoints/{running.pk}/{url}", body, format="json")
        assert answer.status_code == 403, answer.content  # refused before the input is even read
    client.force_login(user)
    page = client.post(f"/compute/endpoints/{running.pk}/update/", {"revision": "main", "server_args": "--x 1"})
    assert page.status_code == 403
    listed = client.get("/compute/endpoints/").content.decode()
    assert f"/compute/endpoints/{running.pk}/update/" not in listed
    assert not EndpointReplica.objects.filter(endpoint=running, replacement_of__isnull=False).exists()


# ---- pages


def test_the_endpoints_page_updates_an_endpoint(running, owner, client):
    client.force_login(owner)
    listed = client.get("/compute/endpoints/").content.decode()
    assert f'action="/compute/endpoints/{running.pk}/update/"' in listed
    assert 'value="--max-model-len 2048"' in listed
    bad_quotes = client.post(
        f"/compute/endpoints/{running.pk}/update/", {"revision": "main", "server_args": "--a 'b"}, follow=True
    )
    assert "Server arguments: Cannot parse the server arguments" in bad_quotes.content.decode()
    reserved = client.post(
        f"/compute/endpoints/{running.pk}/update/", {"revision": "main", "server_args": "--port 1"}, follow=True
    )
    assert "--port is set by the agent itself" in reserved.content.decode()
    same = client.post(
        f"/compute/endpoints/{running.pk}/update/",
        {"revision": "main", "server_args": "--max-model-len 2048"},
        follow=True,
    )
    assert "already" in same.content.decode()
    assert not EndpointReplica.objects.filter(endpoint=running, replacement_of__isnull=False).exists()
    done = client.post(
        f"/compute/endpoints/{running.pk}/update/",
        {"revision": "main", "server_args": "--max-model-len 4096 --chat-template '{{ x }}'"},
    )
    assert done.status_code == 302
    running.refresh_from_db()
    assert running.server_args == ["--max-model-len", "4096", "--chat-template", "{{ x }}"]
    assert EndpointReplica.objects.filter(endpoint=running, replacement_of__isnull=False).count() == 2


def test_the_commands_tab_starts_an_endpoint_with_server_args(nodes, cluster, owner, client):
    client.force_login(owner)
    url = f"/compute/clusters/{cluster.pk}/commands/"
    post = {"command_type": "endpoint.start", "target": str(nodes[0].pk), "p-model_id": "acme/tiny"}
    refused = client.post(url, {**post, "p-extra_args": "--served-model-name other"})
    assert refused.status_code == 400
    assert "--served-model-name is set by the agent itself" in refused.content.decode()
    unparsed = client.post(url, {**post, "p-extra_args": '--chat-template "x'})
    assert unparsed.status_code == 400
    assert "Cannot parse the server arguments" in unparsed.content.decode()
    assert not Endpoint.objects.exists()
    sent = client.post(url, {**post, "p-extra_args": "--max-model-len 1024"})
    assert sent.status_code == 302
    endpoint = Endpoint.objects.get()
    assert endpoint.server_args == ["--max-model-len", "1024"]
    assert endpoint.start_command.payload["extra_args"] == ["--max-model-len", "1024"]


def test_extra_args_of_an_endpoint_start_cannot_be_secret(nodes, cluster, owner):
    from fleet import services

    with pytest.raises(ValidationError) as exc:
        services.command_dispatch(
            actor=owner,
            cluster=cluster,
            command_type="endpoint.start",
            payload={"model_id": "acme/tiny", "extra_args": ["--max-model-len", "1"], "secret_fields": ["extra_args"]},
            node=nodes[0],
        )
    assert "cannot be secret" in exc.value.message_dict["payload.secret_fields"][0]
    assert not Endpoint.objects.exists()
