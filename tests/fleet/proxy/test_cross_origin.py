"""State-changing requests a browser makes to a node origin with its origin cookie must come from that origin.

Finding (black-box probe): the origin cookie is SameSite=Lax, and every node origin sits under one parent
domain, so a page on a sibling origin (`endpoint-<slug>.…`, a workload's own page) is the same *site*: its
`POST` to `ray-<id>.…` carried the cookie and was proxied. The proxy now checks `Origin` (else `Referer`)
on cookie-authenticated requests other than GET/HEAD/OPTIONS. API clients (`Authorization`) are no
browser and are not checked.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from rest_framework.authtoken.models import Token

import raymgr.dashboard_proxy
import raymgr.workloads.serve_proxy
from fleet.proxy import endpoint_routes, origins, resolvers, tickets
from fleet.proxy.resolvers import ProxyRefusal, ProxyTarget
from raymgr.models import RayCluster, RayClusterStatus
from raymgr.workloads.models import ServeDeployment, ServeStatus
from tests.support.endpoints import endpoint_row

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _same_thread(monkeypatch):
    endpoint_routes.forget_routes()
    # database_sync_to_async would close this test's transaction: run the same code on this thread
    for module in (endpoint_routes, tickets, raymgr.dashboard_proxy, raymgr.workloads.serve_proxy):
        monkeypatch.setattr(module, "database_sync_to_async", sync_to_async)
    yield
    endpoint_routes.forget_routes()


@pytest.fixture
def hosts(owner, workspace, cluster, node) -> dict:
    private = endpoint_row(cluster=cluster, node=node, model_id="o/q", status="running", port=8102)
    public = endpoint_row(cluster=cluster, node=node, model_id="o/p", status="running", port=8101, public=True)
    ray = RayCluster.objects.create(
        workspace=workspace, compute_cluster=cluster, name="r", status=RayClusterStatus.RUNNING, head_node=node
    )
    serve = ServeDeployment.objects.create(
        workspace=workspace, ray_cluster=ray, name="s", status=ServeStatus.RUNNING, http_port=8103
    )
    return {
        "ray": origins.DASHBOARD.host(ray.pk),
        "serve": origins.SERVE.host(serve.pk),
        "private": origins.ENDPOINT.host(private.slug),
        "public": origins.ENDPOINT.host(public.slug),
        "sibling": f"http://{origins.ENDPOINT.host('a' * 12)}:8000",
    }


def call(host: str, path: str, *, method: str, user=None, token: str = "", **headers: str) -> object:
    """What the proxy answers a request on `host` (port 8000), with `user`'s origin cookie when given."""
    raw = [(b"host", f"{host}:8000".encode())]
    if user is not None:
        cookie = origins.origin_cookie_header(user_id=str(user.pk), host=host, secure=False).decode()
        raw.append((b"cookie", cookie.split(";", 1)[0].encode()))
    if token:
        raw.append((b"authorization", f"Token {token}".encode()))
    raw += [(name.encode(), value.encode()) for name, value in headers.items()]
    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "headers": raw, "scheme": "http"}
    return async_to_sync(resolvers.resolve)(scope)


def refused_as_cross_origin(answer: object) -> bool:
    return isinstance(answer, ProxyRefusal) and answer.status == 403 and "origin" in answer.message.lower()


@pytest.mark.parametrize("kind", ["ray", "serve", "private"])
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_a_sibling_origins_state_changing_request_with_the_cookie_is_refused(hosts, owner, kind, method):
    answer = call(hosts[kind], "/api/jobs/", method=method, user=owner, origin=hosts["sibling"])
    assert refused_as_cross_origin(answer), answer


def test_referer_stands_in_for_a_missing_origin(hosts, owner):
    sibling = call(hosts["ray"], "/api/jobs/", method="POST", user=owner, referer=f"{hosts['sibling']}/page")
    assert refused_as_cross_origin(sibling)
    same = call(hosts["ray"], "/api/jobs/", method="POST", user=owner, referer=f"http://{hosts['ray']}:8000/#/jobs")
    assert isinstance(same, ProxyTarget)


def test_a_cookie_request_that_names_no_origin_is_refused(hosts, owner):
    """Browsers send Origin with every POST/PUT/PATCH/DELETE; one with neither header is not a page of ours."""
    assert refused_as_cross_origin(call(hosts["ray"], "/api/jobs/", method="POST", user=owner))
    assert refused_as_cross_origin(call(hosts["ray"], "/api/jobs/", method="POST", user=owner, origin="null"))


@pytest.mark.parametrize(
    "origin",
    ["http://{host}", "http://{host}:8001", "http://{host}.evil.example:8000", "http://127.0.0.1:8000"],
)
def test_only_the_very_same_origin_is_the_same(hosts, owner, origin):
    host = hosts["ray"]
    answer = call(host, "/api/jobs/", method="POST", user=owner, origin=origin.format(host=host))
    assert refused_as_cross_origin(answer)


def test_the_same_origin_and_safe_methods_pass(hosts, owner):
    ray = hosts["ray"]
    assert isinstance(call(ray, "/api/jobs/", method="POST", user=owner, origin=f"http://{ray}:8000"), ProxyTarget)
    for method in ("GET", "HEAD", "OPTIONS"):
        assert isinstance(call(ray, "/api/jobs/", method=method, user=owner, origin=hosts["sibling"]), ProxyTarget)


def test_api_clients_with_a_token_are_not_browsers(hosts, owner):
    token = Token.objects.create(user=owner).key
    for kind in ("serve", "private"):
        answer = call(hosts[kind], "/v1/chat/completions", method="POST", token=token, origin=hosts["sibling"])
        assert isinstance(answer, ProxyTarget), answer
        assert isinstance(call(hosts[kind], "/v1/chat/completions", method="POST", token=token), ProxyTarget)


def test_a_public_endpoint_called_from_anywhere_without_the_cookie_still_answers(hosts):
    answer = call(hosts["public"], "/v1/chat/completions", method="POST", origin="https://app.example")
    assert isinstance(answer, ProxyTarget)


@pytest.mark.parametrize("kind", ["serve", "private"])
@pytest.mark.parametrize("role", ["viewer", "member"])
def test_every_member_may_call_an_endpoint_or_deployment_from_its_own_page(hosts, workspace, member_of, kind, role):
    """Calling an endpoint or a Serve deployment (a POST of a prediction) is using it: any member may, with
    a token or the origin cookie, as the API allows any member's token (it is no Ray workload being run)."""
    user = member_of(workspace, role)
    host = hosts[kind]
    own_page = call(host, "/v1/chat/completions", method="POST", user=user, origin=f"http://{host}:8000")
    assert isinstance(own_page, ProxyTarget), own_page
    token = Token.objects.create(user=user).key
    assert isinstance(call(host, "/v1/chat/completions", method="POST", token=token), ProxyTarget)
