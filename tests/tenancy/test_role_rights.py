"""Each role's rights, per page and per API method, in one table (the README's "Tenancy and roles").

Owners and Admins operate: nodes (commands, cordon, drain), compute and Ray clusters, join tokens. Members
also run workloads: they create, stop, restart and update their workspace's endpoints and run training jobs,
Tune experiments and Serve deployments. Viewers read. Quotas are the Owner's.

Every row is one request made by a signed-in user of each role against real rows (a registered node, a
running Ray head, an endpoint, one job, experiment and deployment); "allowed" means the request got past
the role check (any answer but 403, and never a 500), "refused" means 403 with the reason in words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client

from fleet.workloads.models import EndpointStatus
from raymgr.workloads import services as ray_workloads
from raymgr.workloads.models import TuneExperiment
from tests.raymgr.conftest import add_node, compute, make_ray, start_head  # noqa: F401  (fixtures)
from tests.support.endpoints import endpoint_row

pytestmark = pytest.mark.django_db

OPERATORS = frozenset({"owner", "admin"})
EDITORS = frozenset({"owner", "admin", "member"})
OWNER = frozenset({"owner"})
EVERYONE = frozenset({"owner", "admin", "member", "viewer"})
ROLES = ("owner", "admin", "member", "viewer")
SCRIPT = "print('hi')\n"


@dataclass(frozen=True)
class Right:
    """One request: who may make it, where, and with what body (`world` fills in the ids)."""

    name: str
    allowed: frozenset[str]
    method: str
    url: Callable[[dict[str, Any]], str]
    body: Callable[[dict[str, Any]], dict[str, Any]] = lambda w: {}
    api: bool = False


def _page(name, allowed, url, body=lambda w: {}, method="post"):
    return Right(name, allowed, method, url, body)


def _api(name, allowed, method, url, body=lambda w: {}):
    return Right(name, allowed, method, url, body, api=True)


PAGES = [
    # reading: every member
    _page("endpoint list", EVERYONE, lambda w: "/compute/endpoints/", method="get"),
    _page("endpoint page", EVERYONE, lambda w: f"/compute/endpoints/{w['endpoint']}/", method="get"),
    _page("training list", EVERYONE, lambda w: "/ray/training/", method="get"),
    _page("node page", EVERYONE, lambda w: f"/compute/nodes/{w['node']}/", method="get"),
    # workloads: Owners, Admins and Members
    _page(
        "endpoint create",
        EDITORS,
        lambda w: f"/compute/clusters/{w['compute']}/endpoints/new/",
        lambda w: {"model_id": "acme/other", "revision": "main", "gpus": "0", "min_replicas": "1"},
    ),
    _page("endpoint stop", EDITORS, lambda w: f"/compute/endpoints/{w['endpoint']}/stop/"),
    _page("endpoint start", EDITORS, lambda w: f"/compute/endpoints/{w['stopped_endpoint']}/start/"),
    _page(
        "endpoint update",
        EDITORS,
        lambda w: f"/compute/endpoints/{w['endpoint']}/update/",
        lambda w: {"revision": "v2", "server_args": ""},
    ),
    _page("training new (form)", EDITORS, lambda w: "/ray/training/new/", method="get"),
    _page(
        "training create",
        EDITORS,
        lambda w: "/ray/training/new/",
        lambda w: {
            "name": "page-job",
            "ray_cluster": w["ray"],
            "kind": "script",
            "script": SCRIPT,
            "framework": "none",
            "config": "{}",
            "num_workers": "1",
            "cpus_per_worker": "1",
            "gpus_per_worker": "0",
            "checkpoint_every": "1",
            "checkpoints_to_keep": "2",
        },
    ),
    _page("training cancel", EDITORS, lambda w: f"/ray/training/{w['job']}/cancel/"),
    _page("tune cancel", EDITORS, lambda w: f"/ray/tune/{w['experiment']}/cancel/"),
    _page("serve stop", EDITORS, lambda w: f"/ray/serving/{w['deployment']}/stop/"),
    # operating: Owners and Admins
    _page("node cordon", OPERATORS, lambda w: f"/compute/nodes/{w['node']}/cordon/"),
    _page("node drain", OPERATORS, lambda w: f"/compute/nodes/{w['node']}/drain/"),
    _page(
        "node command",
        OPERATORS,
        lambda w: f"/compute/clusters/{w['compute']}/commands/",
        lambda w: {"command_type": "model.download", "node": w["node"], "model_id": "acme/tiny", "revision": "main"},
    ),
    _page("join token", OPERATORS, lambda w: f"/compute/clusters/{w['compute']}/join-tokens/"),
    _page(
        "cluster settings",
        OPERATORS,
        lambda w: f"/compute/clusters/{w['compute']}/settings/",
        lambda w: {"name": "prod", "description": "changed"},
    ),
    _page("Ray cluster stop", OPERATORS, lambda w: f"/ray/clusters/{w['ray']}/stop/"),
    # quotas: the Owner
    _page("quotas", OWNER, lambda w: f"/workspaces/{w['workspace']}/quotas/", lambda w: {"gpus": "4"}),
]

API = [
    _api("GET endpoints", EVERYONE, "get", lambda w: "/api/v1/endpoints/"),
    _api("GET training jobs", EVERYONE, "get", lambda w: "/api/v1/ray/training-jobs/"),
    _api("GET quotas", EVERYONE, "get", lambda w: f"/api/v1/workspaces/{w['workspace']}/quotas/"),
    _api(
        "POST endpoints",
        EDITORS,
        "post",
        lambda w: "/api/v1/endpoints/",
        lambda w: {"cluster": w["compute"], "model_id": "acme/other"},
    ),
    _api("POST endpoint stop", EDITORS, "post", lambda w: f"/api/v1/endpoints/{w['endpoint']}/stop/"),
    _api(
        "POST endpoint update",
        EDITORS,
        "post",
        lambda w: f"/api/v1/endpoints/{w['endpoint']}/update/",
        lambda w: {"revision": "v2"},
    ),
    _api(
        "POST training jobs",
        EDITORS,
        "post",
        lambda w: "/api/v1/ray/training-jobs/",
        lambda w: {"workspace": w["workspace"], "ray_cluster": w["ray"], "name": "api-job", "script": SCRIPT},
    ),
    _api("POST training cancel", EDITORS, "post", lambda w: f"/api/v1/ray/training-jobs/{w['job']}/cancel/"),
    _api(
        "POST tune experiments",
        EDITORS,
        "post",
        lambda w: "/api/v1/ray/tune-experiments/",
        lambda w: {
            "workspace": w["workspace"],
            "ray_cluster": w["ray"],
            "name": "api-sweep",
            "search_space": {"x": {"type": "uniform", "lower": 0, "upper": 1}},
        },
    ),
    _api("POST tune cancel", EDITORS, "post", lambda w: f"/api/v1/ray/tune-experiments/{w['experiment']}/cancel/"),
    _api(
        "POST serve deployments",
        EDITORS,
        "post",
        lambda w: "/api/v1/ray/deployments/",
        lambda w: {"workspace": w["workspace"], "ray_cluster": w["ray"], "name": "api-app", "route_prefix": "/api-app"},
    ),
    _api("POST serve stop", EDITORS, "post", lambda w: f"/api/v1/ray/deployments/{w['deployment']}/stop/"),
    _api("POST node cordon", OPERATORS, "post", lambda w: f"/api/v1/nodes/{w['node']}/cordon/"),
    _api("POST node drain", OPERATORS, "post", lambda w: f"/api/v1/nodes/{w['node']}/drain/"),
    _api(
        "POST cluster command",
        OPERATORS,
        "post",
        lambda w: f"/api/v1/clusters/{w['compute']}/commands/",
        lambda w: {"command_type": "model.download", "node_id": w["node"], "payload": {"model_id": "acme/tiny"}},
    ),
    _api("POST join token", OPERATORS, "post", lambda w: f"/api/v1/clusters/{w['compute']}/join-tokens/"),
    _api(
        "POST clusters",
        OPERATORS,
        "post",
        lambda w: "/api/v1/clusters/",
        lambda w: {"workspace": w["workspace"], "name": "second"},
    ),
    _api("POST Ray cluster stop", OPERATORS, "post", lambda w: f"/api/v1/ray/clusters/{w['ray']}/stop/"),
    _api(
        "PATCH quotas",
        OWNER,
        "patch",
        lambda w: f"/api/v1/workspaces/{w['workspace']}/quotas/",
        lambda w: {"gpus": 4},
    ),
]


@pytest.fixture
def world(owner, workspace, compute, add_node, make_ray) -> dict[str, Any]:  # noqa: F811
    """Rows of every kind in the workspace, made by its Owner."""
    node = add_node(compute, "box-1")
    ray = make_ray(runtime="process", max_workers=0)
    start_head(ray)
    endpoint = endpoint_row(cluster=compute, node=node, model_id="acme/tiny", status=EndpointStatus.RUNNING, port=8100)
    stopped = endpoint_row(cluster=compute, node=node, model_id="acme/tiny", status=EndpointStatus.STOPPED)
    job = ray_workloads.training_job_create(
        actor=owner, workspace=workspace, ray_cluster=ray, name="job", script=SCRIPT
    )
    experiment = ray_workloads.tune_experiment_create(
        actor=owner,
        workspace=workspace,
        ray_cluster=ray,
        name="sweep",
        search_space={"x": {"type": "uniform", "lower": 0, "upper": 1}},
    )
    assert isinstance(experiment, TuneExperiment)
    deployment = ray_workloads.serve_deployment_create(
        actor=owner, workspace=workspace, ray_cluster=ray, name="app", route_prefix="/app"
    )
    ids = {
        "workspace": workspace.pk,
        "compute": compute.pk,
        "node": node.pk,
        "ray": ray.pk,
        "endpoint": endpoint.pk,
        "stopped_endpoint": stopped.pk,
        "job": job.pk,
        "experiment": experiment.pk,
        "deployment": deployment.pk,
    }
    return {k: str(v) for k, v in ids.items()}


def _user(role: str, owner, workspace, member_of):
    return owner if role == "owner" else member_of(workspace, role)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("right", PAGES + API, ids=lambda r: r.name)
def test_each_role_may_do_what_its_role_allows(right, role, world, owner, workspace, member_of, api_client_for):
    user = _user(role, owner, workspace, member_of)
    if right.api:
        client = api_client_for(user)
        response = getattr(client, right.method)(right.url(world), right.body(world), format="json")
    else:
        client = Client()
        client.force_login(user)
        response = getattr(client, right.method)(right.url(world), right.body(world))
    text = response.content.decode()
    assert response.status_code < 500, text[:2000]
    if role in right.allowed:
        assert response.status_code != 403, f"{role} was refused {right.name}: {text[:800]}"
    else:
        assert response.status_code == 403, f"{role} was allowed {right.name}: {response.status_code}"
        assert "Only " in text, text[:800]  # the reason, in words (never a bare "403 Forbidden")
        assert "<h1>403 Forbidden</h1>" not in text
