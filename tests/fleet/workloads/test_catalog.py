"""The model catalog: the repository's file (schema, server arguments on the allow-list), its import and refresh
(management command, admin), the VRAM formula, and the fit computation against nodes whose GPUs are fed the
way agents report them (heartbeats), less what endpoint replicas hold; the API (search, fits, private models,
scoping, roles) and the Models page with Deploy pre-filling the endpoint form."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from agent import protocol
from fleet import services
from fleet.workloads import services as workloads
from fleet.workloads.catalog import (
    CATALOG_PATH,
    GPU_OVERHEAD_MB,
    CatalogError,
    load_catalog,
    vram_needed_mb,
)
from fleet.workloads.catalog_fit import spec_of
from fleet.workloads.models import CatalogModel, EndpointReplica
from tests.fleet import agent_side
from tests.fleet.conftest import facts_dict

pytestmark = pytest.mark.django_db
MIB = 1024 * 1024


def gpu(index: int, total_mb: int, used_mb: int = 0) -> protocol.GpuInfo:
    return protocol.GpuInfo(index=index, name="NVIDIA A100", memory_total_mb=total_mb, memory_used_mb=used_mb)


def report(node, gpus, *, memory_total_mb=64000, memory_used_mb=8000) -> None:
    """What the node's agent reports: its GPUs in its hello (facts and inventory), then a heartbeat with their
    memory in use and its RAM."""
    facts = protocol.from_dict(protocol.HostFacts, facts_dict(node.hostname, gpus=[]), where="facts")
    facts = dataclasses.replace(facts, gpus=list(gpus))
    services.node_connected(node=node, facts=facts, inventory=protocol.Inventory(gpus=list(gpus)))
    beat = protocol.Heartbeat(
        cpu_percent=5.0,
        memory_percent=12.5,
        memory_used_mb=memory_used_mb,
        memory_total_mb=memory_total_mb,
        gpus=list(gpus),
    )
    services.node_record_heartbeat(node_id=node.pk, heartbeat=beat)


@pytest.fixture
def catalog(db):
    outcome = workloads.catalog_import()
    assert outcome["created"] == CatalogModel.objects.count() > 5
    return {m.name: m for m in CatalogModel.objects.all()}


@pytest.fixture
def nodes(cluster, register_node):
    """`one-24g`: one 24 GiB GPU; `eight-80g`: eight 80 GiB GPUs; `busy-24g`: one 24 GiB GPU mostly used;
    `cpu`: no GPU, 16 GiB of RAM with 4 GiB used."""
    made = {name: register_node(cluster, name) for name in ("one-24g", "eight-80g", "busy-24g", "cpu")}
    report(made["one-24g"], [gpu(0, 24576)])
    report(made["eight-80g"], [gpu(i, 81920) for i in range(8)])
    report(made["busy-24g"], [gpu(0, 24576, used_mb=20000)])
    report(made["cpu"], [], memory_total_mb=16384, memory_used_mb=4096)
    for node in made.values():
        node.refresh_from_db()
    assert (made["cpu"].gpu_count, made["eight-80g"].gpu_count) == (0, 8)
    return made


def test_the_repository_catalog_is_valid_and_its_server_args_are_allowed():
    version, entries = load_catalog()
    assert version >= 1
    assert len({e.name for e in entries}) == len(entries) > 5
    for entry in entries:
        _, problems = protocol.check_server_args(entry.server_args)
        assert problems == [], (entry.name, problems)
        assert entry.spec.params_b > 0
        assert entry.spec.kv_bytes_per_token() > 0, entry.name


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ('    server_args: ["--trust-remote-code"]\n', "server_args"),
        ("    params_b: -1\n", "params_b"),
        ("    model_id: not a repo\n", "model_id"),
        ("    quantizations: [{name: int4, bytes_per_param: 99}]\n", "quantizations"),
    ],
)
def test_a_bad_entry_is_refused_naming_its_field(tmp_path, change, field):
    text = "version: 2\nmodels:\n  - name: x\n    model_id: acme/x\n    params_b: 1\n" + change
    path = tmp_path / "catalog.yaml"
    path.write_text(text.replace("    params_b: 1\n", "") if field == "params_b" else text)
    with pytest.raises(CatalogError) as refused:
        load_catalog(path)
    assert any(key.endswith(field) for key in refused.value.problems), refused.value.problems


def test_import_refreshes_the_curated_rows_and_leaves_private_ones(tmp_path, catalog, owner, workspace):
    private = workloads.catalog_private_create(
        actor=owner, workspace=workspace, values={"name": "ours", "model_id": "acme/ours", "params_b": 1}
    )
    edited = tmp_path / "catalog.yaml"
    edited.write_text(
        "version: 9\nmodels:\n"
        "  - {name: qwen2.5-0.5b-instruct, model_id: Qwen/Qwen2.5-0.5B-Instruct, params_b: 0.5, layers: 24,"
        " kv_heads: 2, head_dim: 64}\n"
        "  - {name: brand-new, model_id: acme/new, params_b: 3}\n"
    )
    call_command("catalog_import", "--file", str(edited))
    curated = {m.name: m for m in CatalogModel.objects.filter(workspace__isnull=True)}
    assert set(curated) == {"qwen2.5-0.5b-instruct", "brand-new"}
    assert curated["qwen2.5-0.5b-instruct"].params_b == 0.5
    assert {m.catalog_version for m in curated.values()} == {9}
    assert CatalogModel.objects.filter(pk=private.pk).exists()

    broken = tmp_path / "broken.yaml"
    broken.write_text("version: 10\nmodels:\n  - {name: bad, model_id: acme/bad}\n")
    with pytest.raises(CommandError, match="params_b"):
        call_command("catalog_import", "--file", str(broken))
    assert set(CatalogModel.objects.filter(workspace__isnull=True).values_list("name", flat=True)) == set(curated)


def test_the_vram_formula_for_llama_8b():
    _, entries = load_catalog(CATALOG_PATH)
    spec = next(e.spec for e in entries if e.name == "llama-3.1-8b-instruct")
    kv_per_token = 2 * 32 * 8 * 128 * 2  # K and V, layers, KV heads, head size, fp16
    assert spec.kv_bytes_per_token() == kv_per_token == 128 * 1024
    weights = 8.03e9 * 2
    expected = math.ceil((weights + kv_per_token * 8192 * 4) / MIB) + GPU_OVERHEAD_MB
    assert vram_needed_mb(spec, quantization="bf16", context=8192, batch=4) == expected
    fp8 = math.ceil((8.03e9 + kv_per_token * 8192 * 4) / MIB) + GPU_OVERHEAD_MB
    assert vram_needed_mb(spec, quantization="fp8", context=8192, batch=4) == fp8
    half = math.ceil((weights + kv_per_token * 8192 * 4) / 2 / MIB) + GPU_OVERHEAD_MB
    assert vram_needed_mb(spec, quantization="bf16", context=8192, batch=4, tp=2) == half


def _fits(client, **query) -> dict[str, dict[str, dict]]:
    answer = client.get("/api/v1/catalog/", query)
    assert answer.status_code == 200, answer.content
    return {row["model"]["name"]: {n["node_name"]: n for n in row["nodes"]} for row in answer.json()["results"]}


def test_fit_on_nodes_with_known_gpus(catalog, nodes, owner, api_client_for):
    client = api_client_for(owner)
    fits = _fits(client, context=8192)

    small = fits["llama-3.1-8b-instruct"]  # 8192 tokens: 15,316 MiB of weights + 1 GiB of KV cache + 1.5 GiB
    assert small["one-24g"]["fits"] is True
    assert (small["one-24g"]["device"], small["one-24g"]["tensor_parallel"]) == ("gpu", 1)
    assert small["one-24g"]["needed_mb"] == math.ceil((8.03e9 * 2 + 128 * 1024 * 8192) / MIB) + GPU_OVERHEAD_MB
    assert small["one-24g"]["offered_mb"] == math.floor(24576 * 0.9)
    assert small["busy-24g"]["fits"] is False  # 4,576 MiB left on its GPU
    assert "4576 MiB on each" in small["busy-24g"]["reason"]
    assert small["cpu"]["fits"] is False  # float32 on CPU: 30 GiB
    assert small["cpu"]["device"] == "cpu"

    large = fits["llama-3.1-70b-instruct"]  # 8192 tokens: 134,659 MiB + 2.5 GiB, split over GPUs
    assert large["one-24g"]["fits"] is False
    assert large["eight-80g"]["fits"] is True
    assert large["eight-80g"]["tensor_parallel"] == 2
    assert large["eight-80g"]["needed_mb"] == math.ceil((70.6e9 * 2 + 327680 * 8192) / 2 / MIB) + GPU_OVERHEAD_MB

    tiny = fits["qwen2.5-0.5b-instruct"]
    assert tiny["cpu"]["fits"] is True  # 1,869 MiB of float32 weights + 192 MiB KV + 2.5 GiB within 12 GiB free
    assert tiny["cpu"]["offered_mb"] == 16384 - 4096

    # quantized: the AWQ variant of the 70B fits one 80 GiB GPU, from its own repository
    answer = client.get("/api/v1/catalog/", {"context": 8192, "quantization": "awq-int4", "search": "llama-3.1-70b"})
    (row,) = answer.json()["results"]
    assert row["repo"] == "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"
    eight = next(n for n in row["nodes"] if n["node_name"] == "eight-80g")
    assert (eight["fits"], eight["tensor_parallel"]) == (True, 1)


def test_what_replicas_hold_is_taken_off_the_node(catalog, nodes, cluster, owner, api_client_for):
    big = nodes["eight-80g"]
    agent_side.inventory(big, models=[protocol.CachedModel(model_id="acme/other", revision="main", path="/c/o")])
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/other", gpus=7)
    replica = EndpointReplica.objects.get(endpoint=endpoint)
    assert (replica.node_id, replica.held_gpus) == (big.pk, 7)

    fits = _fits(api_client_for(owner), context=8192)
    large = fits["llama-3.1-70b-instruct"]["eight-80g"]
    assert large["fits"] is False
    assert "needs 2 GPU(s)" in large["reason"]
    assert "1 of 8 GPU(s) free" in large["reason"]
    assert fits["llama-3.1-8b-instruct"]["eight-80g"]["fits"] is True  # one GPU left is enough

    # fits=true keeps only what fits somewhere; the 72B at full context fits nowhere now
    names = set(_fits(api_client_for(owner), fits="true", context=32768))
    assert "llama-3.1-8b-instruct" in names
    assert "qwen2.5-72b-instruct" not in names


def test_cached_nodes_are_named_and_deploy_prefills_the_endpoint_form(catalog, nodes, cluster, owner, client):
    agent_side.inventory(
        nodes["one-24g"],
        models=[protocol.CachedModel(model_id="Qwen/Qwen2.5-7B-Instruct", revision="main", path="/c/q", size_bytes=5)],
    )
    client.force_login(owner)
    page = client.get("/compute/models/", {"search": "qwen2.5-7b", "context": "8192"})
    assert page.status_code == 200
    body = page.content.decode()
    assert "qwen2.5-7b-instruct" in body
    assert "one-24g" in body
    assert "holds the weights" in body
    deploy = f"/compute/clusters/{cluster.pk}/endpoints/?model_id=Qwen%2FQwen2.5-7B-Instruct"
    assert deploy in body

    form = client.get(
        f"/compute/clusters/{cluster.pk}/endpoints/",
        {
            "model_id": "Qwen/Qwen2.5-7B-Instruct",
            "revision": "main",
            "gpus": "1",
            "server_args": "--max-model-len 32768",
        },
    ).content.decode()
    assert '<option value="Qwen/Qwen2.5-7B-Instruct" selected>' in form
    assert 'value="--max-model-len 32768"' in form
    assert '<details class="card new-endpoint" open>' in form


def test_private_models_api_roles_and_scoping(catalog, owner, workspace, other_workspace, member_of, api_client_for):
    client = api_client_for(owner)
    bad = client.post("/api/v1/catalog/", {"workspace": str(workspace.pk), "name": "x", "params_b": -2}, format="json")
    assert bad.status_code == 400
    assert "params_b" in bad.json()
    neither = client.post(
        "/api/v1/catalog/", {"workspace": str(workspace.pk), "name": "x", "params_b": 1}, format="json"
    )
    assert neither.status_code == 400
    assert "model_id" in neither.json()
    refused_args = client.post(
        "/api/v1/catalog/",
        {
            "workspace": str(workspace.pk),
            "name": "x",
            "model_id": "acme/x",
            "params_b": 1,
            "server_args": ["--trust-remote-code"],
        },
        format="json",
    )
    assert refused_args.status_code == 400
    assert "server_args" in refused_args.json()

    made = client.post(
        "/api/v1/catalog/",
        {
            "workspace": str(workspace.pk),
            "name": "our-llm",
            "model_id": "acme/our-llm",
            "revision": "v2",
            "params_b": 1.5,
            "layers": 16,
            "kv_heads": 4,
            "head_dim": 64,
        },
        format="json",
    )
    assert made.status_code == 201, made.content
    local = client.post(
        "/api/v1/catalog/",
        {"workspace": str(workspace.pk), "name": "on-disk", "local_path": "/srv/models/llm", "params_b": 2},
        format="json",
    )
    assert local.status_code == 201, local.content
    assert (local.json()["model_id"], local.json()["local_path"]) == ("local/llm", "/srv/models/llm")
    traversal = client.post(
        "/api/v1/catalog/",
        {"workspace": str(workspace.pk), "name": "up", "local_path": "/srv/../etc", "params_b": 2},
        format="json",
    )
    assert traversal.status_code == 400

    mine = _fits(client, search="our-llm")
    assert list(mine) == ["our-llm"]
    outsider = api_client_for(other_workspace.memberships.get().user)
    assert "our-llm" not in _fits(outsider)
    assert "qwen2.5-0.5b-instruct" in _fits(outsider)  # curated: every workspace
    assert outsider.get(f"/api/v1/catalog/{made.json()['id']}/").status_code == 404

    member = api_client_for(member_of(workspace, "member"))
    denied = member.post(
        "/api/v1/catalog/",
        {"workspace": str(workspace.pk), "name": "m", "model_id": "acme/m", "params_b": 1},
        format="json",
    )
    assert denied.status_code == 403
    assert member.delete(f"/api/v1/catalog/{made.json()['id']}/").status_code == 403
    curated = catalog["qwen2.5-0.5b-instruct"]
    assert client.delete(f"/api/v1/catalog/{curated.pk}/").status_code == 400
    assert client.delete(f"/api/v1/catalog/{made.json()['id']}/").status_code == 204

    assert client.get("/api/v1/catalog/", {"context": "0"}).status_code == 400
    assert client.get("/api/v1/catalog/", {"batch": "x"}).status_code == 400


def test_the_list_costs_the_same_queries_whatever_the_nodes(
    catalog, cluster, register_node, owner, api_client_for, django_assert_max_num_queries
):
    client = api_client_for(owner)
    register_node(cluster, "n0")
    with django_assert_max_num_queries(12) as few:
        client.get("/api/v1/catalog/")
    for i in range(1, 6):
        register_node(cluster, f"n{i}")
    with django_assert_max_num_queries(len(few.captured_queries)):
        client.get("/api/v1/catalog/")


def test_admin_refresh_button(catalog, admin_client, tmp_path):
    CatalogModel.objects.filter(name="qwen2.5-0.5b-instruct").update(params_b=99)
    page = admin_client.get("/admin/fleet/catalogmodel/")
    assert "Refresh from the repository's catalog" in page.content.decode()
    assert admin_client.get("/admin/fleet/catalogmodel/refresh/").status_code == 403
    assert admin_client.post("/admin/fleet/catalogmodel/refresh/").status_code == 302
    assert CatalogModel.objects.get(name="qwen2.5-0.5b-instruct").params_b == 0.49


def test_spec_of_a_row_matches_its_file_entry(catalog):
    _, entries = load_catalog(Path(CATALOG_PATH))
    for entry in entries:
        assert spec_of(catalog[entry.name]) == entry.spec


def test_the_models_page_for_a_viewer_and_with_bad_filters(catalog, nodes, workspace, member_of, client):
    client.force_login(member_of(workspace, "viewer"))
    page = client.get("/compute/models/", {"context": "abc", "batch": "-1", "cluster": "not-a-cluster"})
    assert page.status_code == 200
    body = page.content.decode()
    assert "llama-3.1-70b-instruct" in body  # the filters that do not parse are left out, with their messages
    assert "Enter a whole number." in body
    assert "Add a private model" not in body  # Owners and Admins only
    assert client.post("/compute/models/new/", {"name": "x", "params_b": "1"}).status_code == 302
    assert not CatalogModel.objects.filter(name="x").exists()
