"""Node content on origins of its own, through the real web server, a real agent and a real server on the node.

The server on the node plays a hostile workload: it tries to set the control plane's cookies and a
cookie for the parent domain, and echoes every request header it receives, so the test sees exactly
what reached the node.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.authtoken.models import Token

from fleet import origin_names
from fleet.models import NodeEvent
from fleet.proxy import origins
from fleet.workloads.models import Endpoint, EndpointReplica
from raymgr.models import RayCluster, RayClusterStatus
from tenancy import services as tenancy_services
from tenancy.models import Role
from tests.e2e.conftest import node_of, wait_status
from tests.support.endpoints import endpoint_row
from tests.support.origin_client import redeem_ticket_redirect
from tests.support.processes import free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


class HostileWorkload(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Set-Cookie", "sessionid=planted; Path=/")
        self.send_header("Set-Cookie", "csrftoken=planted; Path=/; Domain=localhost")
        self.send_header("Set-Cookie", "pref=dark; Path=/; Domain=endpoints.localhost")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "8")
        self.end_headers()
        self.wfile.write(b"received")


@pytest.fixture
def hostile_endpoint(control_plane, cluster, operator, agents):
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), HostileWorkload)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    user, _ = operator
    _proc, state, _env = agents(control_plane, cluster, user, "n", extra_env={"CLEVERTHIS_PROXY_PORTS": str(port)})
    node = node_of(state)
    wait_status(node, "online")
    endpoint = endpoint_row(cluster=cluster, node=node, model_id="t/m", status="running", port=port)
    yield endpoint, user
    server.shutdown()
    server.server_close()


def test_node_content_is_served_only_on_its_own_origin(control_plane, hostile_endpoint):
    endpoint, user = hostile_endpoint
    token = Token.objects.create(user=user).key
    browser = Client()
    browser.force_login(user)
    session = browser.cookies["sessionid"].value

    # the control plane's own host: a redirect, and none of the node's body
    path_form = requests.get(
        f"{control_plane.url}/endpoints/{endpoint.slug}/echo",
        headers={"Authorization": f"Token {token}"},
        allow_redirects=False,
        timeout=30,
    )
    assert path_form.status_code == 307
    assert path_form.headers["location"] == f"http://{endpoint.hostname}:{control_plane.ports[0]}/echo"
    assert "set-cookie" not in path_form.headers
    assert "user-agent" not in path_form.text

    # on the endpoint's origin, with every control-plane credential a browser or client might carry
    echoed = requests.get(
        f"{control_plane.url}/echo",
        headers={
            "Host": endpoint.hostname,
            "Authorization": f"Token {token}",
            "X-CSRFToken": "the-callers-csrf-token",
            "Cookie": f"sessionid={session}; csrftoken=the-callers-csrf; app=1",
        },
        timeout=30,
    )
    assert echoed.status_code == 200, echoed.text
    seen = echoed.json()
    assert "authorization" not in seen
    assert "x-csrftoken" not in seen
    assert seen["cookie"] == "app=1"
    set_cookies = echoed.raw.headers.getlist("Set-Cookie")
    assert set_cookies == ["pref=dark; Path=/"]  # no control-plane cookie, none beyond the endpoint's host


def test_a_signed_in_member_reaches_a_private_endpoint_through_a_ticket(control_plane, hostile_endpoint):
    endpoint, user = hostile_endpoint
    browser = Client()
    browser.force_login(user)
    session = {"sessionid": browser.cookies["sessionid"].value}
    opened = requests.get(
        f"{control_plane.url}/endpoints/{endpoint.slug}/echo?x=1", cookies=session, allow_redirects=False, timeout=30
    )
    assert opened.status_code == 302
    assert opened.headers["location"].startswith(f"http://{endpoint.hostname}:{control_plane.ports[0]}/__cleverthis/")
    signed_in = redeem_ticket_redirect(control_plane.url, opened.headers["location"])
    echoed = requests.get(f"{control_plane.url}/echo?x=1", headers=signed_in, timeout=30)
    assert echoed.status_code == 200
    assert "cookie" not in echoed.json()  # the origin cookie itself is not forwarded either
    # the same cookie is no key on another node origin
    elsewhere = {**signed_in, "Host": origin_names.ENDPOINT.host("0" * 12)}
    assert requests.get(f"{control_plane.url}/echo", headers=elsewhere, timeout=30).status_code == 404


def test_websocket_upgrades_from_a_foreign_origin_are_refused(control_plane, cluster, operator, agents):
    """Browsers send ambient credentials (the origin cookie) with WebSocket upgrades from any page."""
    import asyncio
    import socket

    import websockets

    port = free_port()
    ready, loop = threading.Event(), asyncio.new_event_loop()
    stop = loop.create_future()

    async def serve() -> None:
        async with websockets.serve(lambda connection: connection.wait_closed(), "127.0.0.1", port):
            ready.set()
            await stop

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        user, _ = operator
        _proc, state, _env = agents(control_plane, cluster, user, "w", extra_env={"CLEVERTHIS_PROXY_PORTS": str(port)})
        node = node_of(state)
        wait_status(node, "online")
        endpoint = endpoint_row(cluster=cluster, node=node, model_id="t/ws", status="running", port=port, public=True)

        def upgrade(origin: str) -> bytes:
            with socket.create_connection(("127.0.0.1", control_plane.ports[0]), timeout=30) as sock:
                sock.sendall(
                    (
                        f"GET /ws HTTP/1.1\r\nHost: {endpoint.hostname}\r\nUpgrade: websocket\r\n"
                        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                        "Sec-WebSocket-Version: 13\r\n" + (f"Origin: {origin}\r\n" if origin else "") + "\r\n"
                    ).encode()
                )
                return sock.recv(200).split(b"\r\n", 1)[0]

        # The agent's first inventory report after it connects does not list this hand-made endpoint (no
        # server of the agent's own) and fails its row: wait for that report, then mark the row running again.
        # The report also says the agent has no Docker here (`agent.problem`), should it land before the row.
        reported = ("endpoint.failed", "agent.problem")
        wait_until(lambda: NodeEvent.objects.filter(node=node, kind__in=reported).exists(), timeout=30)
        Endpoint.objects.filter(pk=endpoint.pk).update(status="running", failure_code="", failure_message="")
        EndpointReplica.objects.filter(endpoint=endpoint).update(status="running", failure_code="", failure_message="")
        own_origin = f"http://{endpoint.hostname}:{control_plane.ports[0]}"
        wait_until(lambda: upgrade(own_origin).startswith(b"HTTP/1.1 101"), timeout=20, what="the route cache")
        assert upgrade("").startswith(b"HTTP/1.1 101")  # not a browser: nothing ambient to abuse
        # refused before the handshake: 403 (its reason phrase is the server's: "Forbidden", "Access denied")
        assert upgrade("http://evil.example").startswith(b"HTTP/1.1 403 ")
        assert upgrade(f"http://127.0.0.1:{control_plane.ports[0]}").startswith(b"HTTP/1.1 403 ")
    finally:
        loop.call_soon_threadsafe(stop.set_result, None)
        thread.join(10)
        loop.close()


def _signed_in(control_plane, user, path: str) -> dict[str, str]:
    """Headers that reach the node origin `path` (on the control plane) leads to, as `user` signed in."""
    browser = Client()
    browser.force_login(user)
    opened = requests.get(
        f"{control_plane.url}{path}",
        cookies={"sessionid": browser.cookies["sessionid"].value},
        allow_redirects=False,
        timeout=30,
    )
    assert opened.status_code == 302, opened.text
    return redeem_ticket_redirect(control_plane.url, opened.headers["location"])


def test_dashboard_rights_follow_roles_and_other_origins_cannot_post(control_plane, hostile_endpoint):
    """Findings: a Viewer's `POST /api/jobs/` on the dashboard's origin reached the head; a page on a sibling
    origin could POST there with the visitor's origin cookie (one site, so SameSite=Lax let it through)."""
    endpoint, owner = hostile_endpoint
    ray = RayCluster.objects.create(
        workspace=endpoint.cluster.workspace,
        compute_cluster=endpoint.cluster,
        name="r",
        status=RayClusterStatus.RUNNING,
        head_node=endpoint.node,
        dashboard_port=endpoint.port,  # the hostile workload stands in for the head's dashboard
    )
    viewer = get_user_model().objects.create_user("viewer", password="pw-viewer")
    tenancy_services.membership_set(workspace=endpoint.cluster.workspace, user=viewer, role=Role.VIEWER)
    dashboard = f"/ray/clusters/{ray.pk}/dashboard/"
    own_origin = {"Origin": f"http://{origins.DASHBOARD.host(ray.pk)}:{control_plane.ports[0]}"}

    as_viewer = {**_signed_in(control_plane, viewer, dashboard), **own_origin}
    assert requests.get(f"{control_plane.url}/api/jobs/", headers=as_viewer, timeout=30).status_code == 200
    submitted = requests.post(f"{control_plane.url}/api/jobs/", headers=as_viewer, json={}, timeout=30)
    assert submitted.status_code == 403
    assert "Only workspace Owners and Admins" in submitted.text
    killed = requests.get(f"{control_plane.url}/api/actors/kill?actor_id=a", headers=as_viewer, timeout=30)
    assert killed.status_code == 403

    as_owner = _signed_in(control_plane, owner, dashboard)
    url = f"{control_plane.url}/api/jobs/"
    assert requests.post(url, headers={**as_owner, **own_origin}, json={}, timeout=30).text == "received"
    sibling = {"Origin": f"http://{endpoint.hostname}:{control_plane.ports[0]}"}
    from_sibling = requests.post(url, headers={**as_owner, **sibling}, json={}, timeout=30)
    assert from_sibling.status_code == 403
    assert "must come from a page of this origin" in from_sibling.text
    assert requests.post(url, headers=as_owner, json={}, timeout=30).status_code == 403  # names no origin


def test_a_ticket_with_any_next_and_a_malformed_node_host(control_plane, hostile_endpoint):
    """Findings: `next=/logs/€` answered 500 and used the ticket up; `endpoint-zz.<ENDPOINT_DOMAIN>` (no
    node object's name) served the control plane's pages."""
    endpoint, user = hostile_endpoint
    browser = Client()
    browser.force_login(user)
    opened = requests.get(
        f"{control_plane.url}/endpoints/{endpoint.slug}/logs/€",
        cookies={"sessionid": browser.cookies["sessionid"].value},
        allow_redirects=False,
        timeout=30,
    )
    assert opened.status_code == 302
    ticket_url = opened.headers["location"].split(endpoint.hostname, 1)[1].split("/", 1)[1]
    host = {"Host": f"{endpoint.hostname}:{control_plane.ports[0]}"}
    assert "&next=" in ticket_url
    elsewhere = ticket_url.split("&next=", 1)[0] + "&next=https%3A%2F%2Fevil.example%2F"
    bad = requests.get(f"{control_plane.url}/{elsewhere}", headers=host, timeout=30)
    assert bad.status_code == 400  # refused for its input, the ticket left unused
    exchanged = requests.get(f"{control_plane.url}/{ticket_url}", headers=host, allow_redirects=False, timeout=30)
    assert exchanged.status_code == 302, exchanged.text
    assert exchanged.headers["location"] == "/logs/%E2%82%AC"

    for name in (f"endpoint-zz.{origins.ENDPOINT.domain}", origins.DASHBOARD.domain):
        for path in ("/", "/accounts/login/"):
            answer = requests.get(f"{control_plane.url}{path}", headers={"Host": name}, timeout=30)
            assert answer.status_code == 404
            assert answer.headers["content-type"].startswith("text/plain")
    assert requests.get(f"{control_plane.url}/accounts/login/", timeout=30).status_code == 200
