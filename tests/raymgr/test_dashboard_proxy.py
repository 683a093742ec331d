"""Rights on a Ray Dashboard's origin follow the API's role rules, per method and path.

Finding (black-box probe): a Viewer who opened the dashboard through the ticket flow could `POST /api/jobs/`
on `ray-<id>.<RAY_DASHBOARD_DOMAIN>` and run code on the cluster, while the API refuses the same Viewer
(and Members) any Ray workload. Every member may look; only Owners and Admins may act.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async

import raymgr.dashboard_proxy
from fleet.proxy import origins, resolvers
from fleet.proxy.resolvers import ProxyRefusal, ProxyTarget
from raymgr.models import RayCluster, RayClusterStatus

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _same_thread(monkeypatch):
    # Channels' database_sync_to_async closes the thread's connection around each call, which would
    # close this test's transaction; plain sync_to_async runs the same code on this very thread.
    monkeypatch.setattr(raymgr.dashboard_proxy, "database_sync_to_async", sync_to_async)


@pytest.fixture
def ray(workspace, compute, add_node) -> RayCluster:
    head = add_node(compute, "head-1")
    return RayCluster.objects.create(
        workspace=workspace, compute_cluster=compute, name="r", status=RayClusterStatus.RUNNING, head_node=head
    )


def on_dashboard(ray: RayCluster, user, path: str, *, method: str = "GET", kind: str = "http") -> dict:
    """A browser's request on the dashboard's origin, signed in with the origin cookie, from that origin."""
    host = origins.DASHBOARD.host(ray.pk)
    cookie = origins.origin_cookie_header(user_id=str(user.pk), host=host, secure=False).decode().split(";", 1)[0]
    headers = [(b"host", host.encode()), (b"cookie", cookie.encode()), (b"origin", f"http://{host}".encode())]
    scope = {"type": kind, "path": path, "query_string": b"", "headers": headers, "scheme": "http"}
    if kind == "http":
        scope["method"] = method
    return scope


def resolve(scope: dict):
    return async_to_sync(resolvers.resolve)(scope)


ACTING = [
    ("POST", "/api/jobs/"),  # submit a job: run code on the cluster
    ("POST", "/api/jobs/raysubmit_1/stop"),
    ("DELETE", "/api/jobs/raysubmit_1"),
    ("PUT", "/api/serve/applications/"),
    ("DELETE", "/api/serve/applications/"),
    ("PUT", "/api/packages/gcs/pkg.zip"),
    ("PATCH", "/anything"),
    ("GET", "/api/actors/kill"),  # Ray 2.x kills an actor on a GET
    ("GET", "/logical/kill_actor"),
    ("GET", "/worker/cpu_profile"),  # profilers attach to live worker processes
    ("GET", "/worker/gpu_profile"),
    ("GET", "/task/cpu_profile"),
    ("GET", "/memory_profile"),
]
READING = [
    ("GET", "/"),
    ("HEAD", "/"),
    ("GET", "/api/jobs/"),
    ("GET", "/api/jobs/raysubmit_1/logs"),
    ("GET", "/api/v0/actors"),
    ("GET", "/api/serve/applications/"),
    ("GET", "/nodes"),
    ("GET", "/api/cluster_status"),
    ("OPTIONS", "/api/jobs/"),
]


@pytest.mark.parametrize("role", ["viewer", "member"])
@pytest.mark.parametrize(("method", "path"), ACTING)
def test_viewers_and_members_cannot_act_through_the_dashboard(ray, workspace, member_of, role, method, path):
    refused = resolve(on_dashboard(ray, member_of(workspace, role), path, method=method))
    assert isinstance(refused, ProxyRefusal), refused
    assert refused.status == 403
    assert "Only workspace Owners and Admins" in refused.message


@pytest.mark.parametrize("role", ["viewer", "member", "admin"])
@pytest.mark.parametrize(("method", "path"), READING)
def test_every_member_may_look_at_the_dashboard(ray, workspace, member_of, role, method, path):
    assert isinstance(resolve(on_dashboard(ray, member_of(workspace, role), path, method=method)), ProxyTarget)


@pytest.mark.parametrize(("method", "path"), ACTING)
def test_owners_and_admins_may_act_through_the_dashboard(ray, owner, workspace, member_of, method, path):
    assert isinstance(resolve(on_dashboard(ray, owner, path, method=method)), ProxyTarget)
    assert isinstance(resolve(on_dashboard(ray, member_of(workspace, "admin"), path, method=method)), ProxyTarget)


def test_a_viewers_websocket_may_tail_logs_but_not_reach_an_acting_path(ray, workspace, member_of):
    viewer = member_of(workspace, "viewer")
    tail = on_dashboard(ray, viewer, "/api/jobs/raysubmit_1/logs/tail", kind="websocket")
    assert isinstance(resolve(tail), ProxyTarget)
    assert resolve(on_dashboard(ray, viewer, "/api/actors/kill", kind="websocket")).status == 403


def test_a_job_id_that_looks_like_an_action_is_still_a_read(ray, workspace, member_of):
    viewer = member_of(workspace, "viewer")
    assert isinstance(resolve(on_dashboard(ray, viewer, "/api/jobs/stop")), ProxyTarget)  # a job named "stop"
    assert isinstance(resolve(on_dashboard(ray, viewer, "/api/jobs/stop/logs")), ProxyTarget)
