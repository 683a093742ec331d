"""Node content lives on origins of its own (`fleet.proxy.origins`), never on the control plane's.

Pinned here: every proxied route (endpoints, Serve deployments, Ray Dashboards) answers the control
plane's host with a redirect at most, never with a node's body (a property test over hosts, paths,
methods and credentials); the single-use ticket and the host-bound origin cookie; the control plane's
session is no key to a node origin; what the proxy forwards and lets a node set.
"""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token

import fleet.proxy.endpoint_routes  # noqa: F401  (registers the endpoint resolver, as cleverthis.asgi does)
import raymgr.dashboard_proxy
import raymgr.workloads.serve_proxy
from fleet import origin_names
from fleet.proxy import endpoint_routes, origins, resolvers, tickets
from fleet.proxy import headers as proxy_headers
from fleet.proxy.resolvers import ProxyRedirect, ProxyRefusal, ProxyTarget
from fleet.workloads.models import Endpoint, EndpointStatus
from raymgr.models import RayCluster, RayClusterStatus
from raymgr.workloads.models import ServeDeployment, ServeStatus
from tests.support.endpoints import endpoint_row

pytestmark = pytest.mark.django_db

CONTROL_PLANE_HOSTS = ["127.0.0.1:8000", "localhost:8000", "localhost", "fleet.example.com", "testserver"]


@pytest.fixture(autouse=True)
def _fresh_routes(monkeypatch):
    endpoint_routes.forget_routes()
    # Channels' database_sync_to_async closes the thread's connection around each call, which would
    # close this test's transaction; plain sync_to_async runs the same code on this very thread.
    for module in (endpoint_routes, tickets, raymgr.dashboard_proxy, raymgr.workloads.serve_proxy):
        monkeypatch.setattr(module, "database_sync_to_async", sync_to_async)
    yield
    endpoint_routes.forget_routes()


@pytest.fixture
def world(owner, workspace, cluster, node):
    """A running public and private endpoint, a running Ray cluster with its head, a serving deployment,
    and a member's credentials of every kind."""
    public = endpoint_row(cluster=cluster, node=node, model_id="o/p", status="running", port=8101, public=True)
    private = endpoint_row(cluster=cluster, node=node, model_id="o/q", status="running", port=8102)
    ray = RayCluster.objects.create(
        workspace=workspace, compute_cluster=cluster, name="r", status=RayClusterStatus.RUNNING, head_node=node
    )
    serve = ServeDeployment.objects.create(
        workspace=workspace, ray_cluster=ray, name="s", status=ServeStatus.RUNNING, http_port=8103
    )
    browser = Client()
    browser.force_login(owner)
    return {
        "public": public,
        "private": private,
        "ray": ray,
        "serve": serve,
        "token": Token.objects.create(user=owner).key,
        "session": browser.cookies["sessionid"].value,
        "owner": owner,
    }


def request(host: str, path: str, *, method: str = "GET", token: str = "", cookie: str = "") -> dict:
    headers = [(b"host", host.encode())]
    if token:
        headers.append((b"authorization", f"Token {token}".encode()))
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return {"type": "http", "method": method, "path": path, "query_string": b"", "headers": headers, "scheme": "http"}


def resolve(scope: dict):
    return async_to_sync(resolvers.resolve)(scope)


def origin_cookie(owner, host: str) -> str:
    header = origins.origin_cookie_header(user_id=str(owner.pk), host=host, secure=False).decode()
    return header.split(";", 1)[0]


def path_forms(w: dict) -> list[str]:
    return [
        f"/endpoints/{w['public'].slug}/",
        f"/endpoints/{w['private'].slug}/v1/models",
        f"/ray/clusters/{w['ray'].pk}/dashboard/",
        f"/ray/clusters/{w['ray'].pk}/dashboard/api/version",
        f"/ray/serving/{w['serve'].pk}/endpoint/",
    ]


def test_on_their_own_origins_the_routes_do_reach_the_node(world):
    """The other half of the property below: the origins themselves do proxy (it is not vacuous)."""
    owner = world["owner"]
    public_host = origin_names.ENDPOINT.host(world["public"].slug)
    assert isinstance(resolve(request(public_host, "/v1/models")), ProxyTarget)
    private_host = origin_names.ENDPOINT.host(world["private"].slug)
    assert isinstance(resolve(request(private_host, "/", token=world["token"])), ProxyTarget)
    assert isinstance(resolve(request(private_host, "/", cookie=origin_cookie(owner, private_host))), ProxyTarget)
    ray_host = origin_names.DASHBOARD.host(world["ray"].pk)
    assert isinstance(resolve(request(ray_host, "/api/version", cookie=origin_cookie(owner, ray_host))), ProxyTarget)
    serve_host = origin_names.SERVE.host(world["serve"].pk)
    assert isinstance(resolve(request(serve_host, "/", method="POST", token=world["token"])), ProxyTarget)


@hypothesis_settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_node_body_is_ever_served_on_the_control_planes_host(world, data):
    host = data.draw(
        st.sampled_from(CONTROL_PLANE_HOSTS)
        | st.from_regex(r"\A[a-z0-9]([a-z0-9.-]{0,40}[a-z0-9])?(:[0-9]{1,5})?\Z", fullmatch=True)
    )
    if origins.is_node_origin(request(host, "/")):  # a node origin by chance: not the control plane's host
        return
    path = data.draw(
        st.sampled_from(path_forms(world)).flatmap(lambda p: st.text("abc/.%?=-_", max_size=20).map(lambda s: p + s))
        | st.text(min_size=1, max_size=60).map(lambda s: "/" + s)
    )
    method = data.draw(st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE"]))
    owner = world["owner"]
    credentials = data.draw(
        st.sampled_from(
            [
                {},
                {"token": world["token"]},
                {"cookie": f"sessionid={world['session']}"},
                {"cookie": origin_cookie(owner, host.rsplit(":", 1)[0])},
                {"cookie": origin_cookie(owner, origin_names.DASHBOARD.host(world["ray"].pk))},
            ]
        )
    )
    answer = resolve(request(host, path, method=method, **credentials))
    assert not isinstance(answer, ProxyTarget), (host, path, answer)


def test_path_forms_redirect_to_the_origin_keeping_path_and_query(world):
    slug = world["public"].slug
    scope = request("127.0.0.1:8000", f"/endpoints/{slug}/v1/models", token=world["token"])
    scope["query_string"] = b"a=1"
    assert resolve(scope) == ProxyRedirect(f"http://endpoint-{slug}.endpoints.localhost:8000/v1/models?a=1", 307)
    serve = world["serve"]
    answer = resolve(request("cp.test", f"/ray/serving/{serve.pk}/endpoint/predict", method="POST"))
    assert answer == ProxyRedirect(f"http://{origin_names.SERVE.host(serve.pk)}/predict", 307)


def test_a_signed_in_member_goes_through_a_single_use_ticket(world):
    ray = world["ray"]
    answer = resolve(
        request(
            "127.0.0.1:8000", f"/ray/clusters/{ray.pk}/dashboard/api/version", cookie=f"sessionid={world['session']}"
        )
    )
    assert isinstance(answer, ProxyRedirect)
    assert answer.status == 302
    host = origin_names.DASHBOARD.host(ray.pk)
    assert answer.location.startswith(f"http://{host}:8000{origins.TICKET_PATH}?ticket=")
    ticket = answer.location.split("ticket=", 1)[1].split("&", 1)[0]
    from urllib.parse import unquote

    ticket = unquote(ticket)
    assert origins.redeem_ticket(ticket, host=origin_names.DASHBOARD.host(world["serve"].pk)) is None  # another host
    assert origins.redeem_ticket(ticket, host=host) == str(world["owner"].pk)
    assert origins.redeem_ticket(ticket, host=host) is None  # used once already


def test_a_ticket_expires(world, settings, monkeypatch):
    host = origin_names.ENDPOINT.host(world["private"].slug)
    ticket = origins.ticket_for(user_id=world["owner"].pk, host=host)
    now = time.time()
    monkeypatch.setattr("django.core.signing.time.time", lambda: now + settings.ORIGIN_TICKET_MAX_AGE_S + 1)
    assert origins.redeem_ticket(ticket, host=host) is None


def test_the_control_planes_session_is_no_key_to_a_node_origin(world):
    """Even where a session cookie reaches a node origin (a parent-domain cookie), it is not accepted."""
    private_host = origin_names.ENDPOINT.host(world["private"].slug)
    refused = resolve(request(private_host, "/", cookie=f"sessionid={world['session']}"))
    assert refused == ProxyRefusal(401, endpoint_routes.UNAUTHENTICATED)
    ray_host = origin_names.DASHBOARD.host(world["ray"].pk)
    assert resolve(request(ray_host, "/", cookie=f"sessionid={world['session']}")).status == 401
    # an origin cookie is bound to its own host
    other = origin_cookie(world["owner"], private_host)
    assert resolve(request(ray_host, "/", cookie=other)).status == 401


def test_the_dashboard_refuses_tokens_and_strangers(world, make_user):
    ray_host = origin_names.DASHBOARD.host(world["ray"].pk)
    assert resolve(request(ray_host, "/", token=world["token"])).status == 401
    stranger = make_user("stranger")
    assert resolve(request(ray_host, "/", cookie=origin_cookie(stranger, ray_host))) == ProxyRefusal(
        404, "No such Ray cluster."
    )


def test_what_is_forwarded_to_a_node_holds_no_control_plane_credential():
    """Finding: the caller's X-CSRFToken header used to reach the node."""
    forwarded = proxy_headers.upstream_headers(
        {
            "headers": [
                (b"x-csrftoken", b"tok"),
                (b"authorization", b"Token k"),
                (b"cookie", f"sessionid=s; csrftoken=c; {origins.ORIGIN_COOKIE}=o; app=1".encode()),
                (b"accept", b"*/*"),
            ]
        }
    )
    assert forwarded == [(b"cookie", b"app=1"), (b"accept", b"*/*")]


def test_a_node_cannot_set_a_control_plane_cookie_or_one_beyond_its_host():
    """Finding: a node's `Set-Cookie: sessionid=…; Path=/` reached the browser through the proxy."""
    headers = proxy_headers.downstream_headers(
        [
            (b"set-cookie", b"sessionid=evil; Path=/"),
            (b"Set-Cookie", b"csrftoken=evil; Path=/; Domain=localhost"),
            (b"set-cookie", f"{origins.ORIGIN_COOKIE}=forged; Path=/".encode()),
            (b"set-cookie", b"pref=dark; Domain=.endpoints.localhost; Path=/; HttpOnly"),
            (b"content-type", b"text/html"),
        ]
    )
    assert headers == [(b"set-cookie", b"pref=dark; Path=/; HttpOnly"), (b"content-type", b"text/html")]


def test_websocket_upgrades_from_another_origin_are_refused():
    host = f"endpoint-{'a' * 12}.endpoints.localhost"

    def scope(origin: str) -> dict:
        headers = [(b"host", f"{host}:8000".encode())] + ([(b"origin", origin.encode())] if origin else [])
        return {"type": "websocket", "headers": headers}

    assert origins.websocket_origin_allowed(scope(f"http://{host}:8000"))
    assert origins.websocket_origin_allowed(scope(""))  # not a browser: no ambient credentials to abuse
    assert not origins.websocket_origin_allowed(scope("http://evil.example"))
    assert not origins.websocket_origin_allowed(scope("http://127.0.0.1:8000"))


@pytest.mark.parametrize("next_path", ["https://evil.example/", "//evil.example/x", "/\\evil.example", "evil"])
def test_the_ticket_exchange_only_goes_on_to_a_path_of_the_same_origin(next_path):
    assert origins.safe_next(next_path) == "/"
    assert origins.safe_next("/api/version?x=1") == "/api/version?x=1"


def test_the_ticket_exchange_sets_a_host_only_cookie_and_refuses_reuse(world):
    import asyncio

    host = origin_names.DASHBOARD.host(world["ray"].pk)
    ticket = origins.ticket_for(user_id=world["owner"].pk, host=host)
    from urllib.parse import quote

    def exchange() -> dict:
        scope = request(f"{host}:8000", origins.TICKET_PATH)
        scope["query_string"] = f"ticket={quote(ticket)}&next=/api/version".encode()
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        asyncio.run(tickets.exchange_ticket(scope, send))
        return {"status": sent[0]["status"], "headers": dict(sent[0]["headers"])}

    first = exchange()
    assert first["status"] == 302
    assert first["headers"][b"location"] == b"/api/version"
    cookie = first["headers"][b"set-cookie"].decode()
    assert cookie.startswith(f"{origins.ORIGIN_COOKIE}=")
    assert "; HttpOnly; SameSite=Lax" in cookie
    assert "Domain" not in cookie
    assert exchange()["status"] == 403


def test_endpoint_urls_use_the_configured_origin_scheme_and_port(world, settings):
    endpoint = world["public"]
    assert endpoint.url == f"https://endpoint-{endpoint.slug}.endpoints.localhost"
    settings.NODE_ORIGIN_SCHEME, settings.NODE_ORIGIN_PORT = "http", "8000"
    assert endpoint.url == f"http://endpoint-{endpoint.slug}.endpoints.localhost:8000"
    assert world["serve"].url == f"http://serve-{world['serve'].pk}.endpoints.localhost:8000"


def test_a_running_endpoint_status_is_checked_on_the_origin(world):
    Endpoint.objects.filter(pk=world["public"].pk).update(status=EndpointStatus.STOPPED)
    host = origin_names.ENDPOINT.host(world["public"].slug)
    assert resolve(request(host, "/")) == ProxyRefusal(503, "Endpoint is stopped, not running.")
