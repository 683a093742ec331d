"""What the five slow requests of the browser walk spent, pinned (issue 43, item 8).

- `/api/v1/endpoints/` (and every first request of a process): the URLconf, and with it every view and
  serializer module, was imported by the first request each process served (~1.2 s here); the ASGI
  application now loads it at start-up. Its queries were already constant (3, pinned in
  tests/fleet/workloads/test_workload_api.py).
- `/api/docs/`: the page fetches `/api/schema/`, which was generated again for every visit (0.2-0.9 s and a
  dozen queries); it is generated once per process now.
- the admin quota list, the training job list (API and page) and training-job create: constant queries
  however many rows exist, pinned here.
- the first sign-in: the password hasher (PBKDF2, deliberately slow) is most of it; left as it is.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from raymgr.workloads import services as ray_workloads
from tenancy import services as tenancy
from tests.raymgr.conftest import add_node, compute, make_ray, start_head  # noqa: F401  (fixtures)
from tests.support.processes import REPO_ROOT

pytestmark = pytest.mark.django_db
SCRIPT = "print('hi')\n"


@pytest.fixture
def ray(compute, add_node, make_ray):  # noqa: F811
    add_node(compute, "box-1")
    cluster = make_ray(runtime="process", max_workers=0)
    start_head(cluster)
    return cluster


def _queries(call) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = call()
    assert response.status_code < 400, response.content[:500]
    return len(captured)


def test_the_asgi_application_loads_every_view_and_compiles_the_pages_at_start_up(tmp_path):
    code = (
        "import sys, cleverthis.asgi; "
        "print(all(m in sys.modules for m in ('cleverthis.urls', 'fleet.api.serializers', 'fleet.workloads.api')))\n"
        "from django.template import engines\n"
        "cached = engines['django'].engine.template_loaders[0].get_template_cache\n"
        "print('raymgr/workloads/form.html' in cached, 'workloads/api_keys.html' in cached)"
    )
    # DEBUG=1: the development key is accepted (this run is about start-up work, not the key's strength)
    env = {"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "m"), "SERVE_STATIC": "0", "DEBUG": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["True", "True", "True"], out.stderr[-2000:]  # views loaded, pages compiled


def test_the_api_schema_is_generated_once_per_process(client, owner):
    client.force_login(owner)
    client.get("/api/schema/")  # the first visit of this process (or of an earlier test) generated it
    with CaptureQueriesContext(connection) as again:
        response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    assert "/api/v1/endpoints/" in response.json()["paths"]
    assert len(again) == 2  # the session and its user; nothing for the document itself
    assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")
    assert client.get("/api/schema/?format=json").content == response.content
    assert client.get("/api/docs/").status_code == 200


def test_the_admin_quota_list_costs_the_same_for_1_or_10_workspaces(owner, make_user):
    owner.is_staff = owner.is_superuser = True
    owner.save()
    admin = Client()
    admin.force_login(owner)
    one = _queries(lambda: admin.get("/admin/tenancy/workspacequota/"))
    for i in range(9):
        tenancy.workspace_create(name=f"Team {i}", owner=make_user(f"lead-{i}"))
    page = admin.get("/admin/tenancy/workspacequota/")
    assert page.content.decode().count("Team ") >= 9
    assert _queries(lambda: admin.get("/admin/tenancy/workspacequota/")) == one == 5


def test_training_job_list_and_create_cost_the_same_however_many_jobs(owner, workspace, ray, api_client_for):
    api = api_client_for(owner)
    page = Client()
    page.force_login(owner)

    def create(name: str):
        body = {"workspace": str(workspace.pk), "ray_cluster": str(ray.pk), "name": name, "script": SCRIPT}
        return api.post("/api/v1/ray/training-jobs/", body, format="json")

    first_create = _queries(lambda: create("first"))
    lists = (_queries(lambda: api.get("/api/v1/ray/training-jobs/")), _queries(lambda: page.get("/ray/training/")))
    for i in range(6):
        ray_workloads.training_job_create(
            actor=owner, workspace=workspace, ray_cluster=ray, name=f"j{i}", script=SCRIPT
        )
    assert _queries(lambda: create("eighth")) == first_create
    # the workspace, the cluster, the insert, the head, the command, the audit entry…, and the queue's dispatch
    # (the cluster locked, its waiting and running jobs, its Ray nodes, its GPU capacity)
    assert first_create == 35
    assert (
        _queries(lambda: api.get("/api/v1/ray/training-jobs/")),
        _queries(lambda: page.get("/ray/training/")),
    ) == lists
    assert lists == (2, 4)  # count + page; session, user, the rows, their clusters
