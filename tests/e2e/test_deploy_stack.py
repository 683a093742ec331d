"""The one-machine stack of deploy/compose, run by podman-compose from the images deploy/build-image makes,
brought up once for the module with the README's commands (docs/deploy.md):

- it serves TLS from a local CA; an agent joins through https:// verifying that CA and goes online;
- the client's address is HAProxy's word alone (a forged or malformed X-Forwarded-For changes nothing, a
  request straight to web is its own peer), answers over https carry HSTS, a public SECRET_KEY is refused,
  and the peer listener closes unauthenticated connections that announce big frames or exceed the cap;
- an endpoint answers on its own `https://endpoint-….endpoints.localhost` origin through HAProxy, and a
  streamed (SSE) answer arrives unbuffered through every hop;
- a browser signs in over https and gets `__Host-` cookies (HTTPS_COOKIES=1);
- a worker or a web replica killed inside the stack is started again by its restart policy, the agent
  reconnects, and commands flow again;
- deploy/compose/roll moves every process to a fresh container, the agent's tunnel moving exactly once
  (make-before-break) while the node stays online, and a command after the roll runs.

The tests run in this order and share the stack and the node. Skipped (with the reason) where the stack
cannot run: not root, no Podman, no podman-compose, or images that cannot be built here (deploy/build-image
exit 3). `.ci/test` builds the images first (cached).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.support.browser import chromium, needs_chromium
from tests.support.compose_stack import COMPOSE_DIR, Stack, dispatch_and_wait, running_stack, start_endpoint
from tests.support.hub_standin import HubStandin
from tests.support.live import agent_join, agent_run, stop_endpoint_servers
from tests.support.processes import VENV_BIN, ManagedProcess, wait_until

MODELS = (
    "acme/tiny",
    "acme/again",
    "acme/chat",
    "acme/after-web-1",
    "acme/after-web-2",
    "acme/after-roll",
    "acme/after-peer-probe",
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


@dataclass
class JoinedNode:
    """The agent joined to the stack: its node, its process and the gate its endpoint's streams wait on."""

    node_id: str
    agent: ManagedProcess
    state: Path
    stream_gate: Path

    def tunnels(self) -> int:
        """How many times the agent's tunnel has connected so far."""
        return self.agent.log().count("connected to ")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # production's presence settings: a node offline after 90 s without a heartbeat (the agent sends one
    # every 30 s), or 10 s after its tunnel closed unless it reconnected meanwhile
    with running_stack(tmp_path_factory.mktemp("stack")) as plane:
        yield plane


@pytest.fixture(scope="module")
def node(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JoinedNode]:
    """An agent joined over https (trusting exactly the local CA), its endpoints served by the stand-in."""
    workdir = tmp_path_factory.mktemp("node")
    assert stack.manage("bootstrap_demo").returncode == 0, stack.logs()
    token = stack.manage("local_node_token", "--state-dir", "/tmp/none", "--url", stack.url).stdout.strip()
    assert token, stack.logs()
    tls_env = {"SSL_CERT_FILE": str(stack.ca), "REQUESTS_CA_BUNDLE": str(stack.ca)}
    state = workdir / "agent"
    joined = agent_join(stack.url, token, state, env=tls_env)
    assert joined.returncode == 0, joined.stderr
    hub = HubStandin().start()
    for model in MODELS:
        hub.add_repo(model, {"config.json": b"{}"})
    gate = workdir / "stream-gate"
    server = f"{VENV_BIN / 'python'} -m tests.support.openai_standin --stream-gate {gate}"
    env = {**tls_env, "HF_ENDPOINT": hub.url, "CLEVERTHIS_MODEL_CACHE": str(workdir / "models")}
    agent = agent_run(state, workdir, env={**env, "CLEVERTHIS_ENDPOINT_SERVER": server})
    try:
        wait_until(lambda: "connected to" in agent.log(), timeout=60, interval=0.5, what="the agent's tunnel")
        yield JoinedNode(json.loads((state / "node.json").read_text())["node_id"], agent, state, gate)
    finally:
        gate.touch()  # a stream still held lets go
        agent.stop()
        stop_endpoint_servers(state)
        hub.stop()


def node_status(stack: Stack, node: JoinedNode) -> str:
    return stack.shell(f'from fleet.models import Node; print(Node.objects.get(pk="{node.node_id}").status)')


def offline_events(stack: Stack, node: JoinedNode) -> list[str]:
    """The node's offline events so far, each with its time and reason."""
    events = f'NodeEvent.objects.filter(node_id="{node.node_id}", kind="offline").order_by("created_at")'
    lines = f"[f'{{e.created_at}} {{e.message}}' for e in {events}]"
    code = f"import json; from fleet.models import NodeEvent; print(json.dumps({lines}))"
    return json.loads(stack.shell(code))


def kill_and_see_it_restarted(stack: Stack, container: str) -> None:
    """SIGKILL the container's main process (as an OOM kill would); wait until its restart policy restarted it."""
    before = stack.pid(container)
    os.kill(before, signal.SIGKILL)
    wait_until(lambda: stack.pid(container) not in (0, before), timeout=60, interval=0.5, what=f"{container} back")


def reconnect_gaps(log: str) -> list[float]:
    """Seconds from each tunnel loss the agent logged to its next "connected to" line."""
    stamps = re.findall(
        r"^(\S+ \S+) \S+ \S+ (disconnected|cannot connect|tunnel session ended|connected to)", log, re.M
    )
    gaps, lost = [], None
    for stamp, what in stamps:
        when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
        if what == "connected to" and lost is not None:
            gaps.append((when - lost).total_seconds())
            lost = None
        elif what != "connected to" and lost is None:
            lost = when
    return gaps


def wait_healthy(stack: Stack, container: str) -> None:
    """Wait until the container passes the health check the compose file declares for it."""
    passes = lambda: stack.podman("healthcheck", "run", container).returncode == 0  # noqa: E731
    wait_until(passes, timeout=120, interval=1, what=f"{container} healthy")


def test_stack_serves_tls_and_an_agent_joins_over_https(stack: Stack, node: JoinedNode):
    # TLS from the local CA; a client that does not trust it is refused
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{stack.url}/healthz", timeout=5, verify=True)
    # a host that is neither the control plane nor a node origin is not served
    assert requests.get(f"{stack.url}/healthz", headers={"Host": "elsewhere.test"}, verify=str(stack.ca),
                        timeout=5).status_code == 404  # fmt: skip
    # two web replicas behind the proxy, exactly one beat
    assert stack.names("web") == [stack.container("web", 1), stack.container("web", 2)]
    assert stack.names("beat") == [stack.container("beat")]
    # the health checks the compose file declares pass (Podman without systemd runs them only when asked)
    for service in ("web", "worker"):
        checked = stack.podman("healthcheck", "run", stack.container(service))
        assert checked.returncode == 0, f"{service}: {checked.stdout}{checked.stderr}"

    assert node_status(stack, node) == "online"
    assert dispatch_and_wait(stack, node.node_id, "acme/tiny") == "succeeded", node.agent.log()[-2000:]


# Run inside the worker container against the web process holding the tunnel's peer listener: (1) a
# connection announcing a 1 MiB frame before any proof is closed while a silent one accepted before it is
# still open (at its header, not at the handshake deadline); (2) with `cap` silent connections waiting,
# one more is closed while they are all still open; (3) those are dropped at the handshake deadline.
PEER_PROBE = r"""
import json, socket, struct, sys
host, port, cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def closed(s, wait):
    s.settimeout(wait)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
def open_now(s):
    try:
        return s.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
silent = socket.create_connection((host, port))
big = socket.create_connection((host, port))
big.sendall(struct.pack("!BQI", 1, 0, 1 << 20) + b"x" * 4096)
result = {"oversized_closed": closed(big, 30), "silent_open_meanwhile": open_now(silent)}
closed(silent, 30)
waiting = [socket.create_connection((host, port)) for _ in range(cap)]
extra = socket.create_connection((host, port))
result["extra_closed"] = closed(extra, 30)
result["waiting_open_meanwhile"] = sum(open_now(s) for s in waiting)
result["waiting_dropped_later"] = sum(closed(s, 30) for s in waiting)
print(json.dumps(result))
"""

# Run inside the worker container: a request straight to a web replica (not through the proxy) that
# claims another client and https; prints the status and whether HSTS came back.
DIRECT_REQUEST = r"""
import sys, urllib.request
headers = {"Host": "localhost", "Authorization": "Bearer " + sys.argv[1], "X-Forwarded-For": "203.0.113.77",
           "X-Forwarded-Proto": "https"}
answer = urllib.request.urlopen(urllib.request.Request("http://web:8000/api/v1/clusters/", headers=headers), timeout=30)
print(answer.status, "strict-transport-security" in {k.lower() for k in answer.headers})
"""


def container_ip(stack: Stack, container: str) -> str:
    found = stack.podman("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container)
    return found.stdout.strip()


def test_the_stack_believes_the_proxy_alone_refuses_weak_keys_and_bounds_peer_connections(
    stack: Stack, node: JoinedNode
):
    # -- the client's address (issue 41, item 4): HAProxy replaces X-Forwarded-For, web believes only HAProxy
    made = f"""
from fleet.models import Node
from fleet.workloads import services
node = Node.objects.get(pk="{node.node_id}")
owner = node.cluster.workspace.memberships.get(role="owner").user
print(" ".join(services.api_key_create(actor=owner, workspace=node.cluster.workspace, name=f"address-probe-{{n}}",
                                       scopes=["read"])[1] for n in range(3)))
"""
    spoofed, malformed, direct = stack.shell(made).split()

    def api(key: str, forwarded: str) -> requests.Response:
        headers = {"Authorization": f"Bearer {key}", "X-Forwarded-For": forwarded}
        return requests.get(f"{stack.url}/api/v1/clusters/", headers=headers, verify=str(stack.ca), timeout=30)

    through_proxy = api(spoofed, "203.0.113.66")
    assert through_proxy.status_code == 200, through_proxy.text
    assert through_proxy.headers["Strict-Transport-Security"] == "max-age=31536000"  # behind TLS: HSTS
    assert api(malformed, "not-an-ip").status_code == 200  # never a 500
    worker = stack.container("worker")
    answered = stack.podman("exec", worker, "python", "-c", DIRECT_REQUEST, direct)
    assert answered.stdout.split() == ["200", "False"], answered.stdout + answered.stderr  # no https claimed
    seen = json.loads(
        stack.shell(
            "import json; from tenancy.models import ApiKey; print(json.dumps({k.name[-1]: k.last_used_ip "
            "for k in ApiKey.objects.filter(name__startswith='address-probe-')}))"
        )
    )
    proxy_ip = container_ip(stack, stack.container("proxy"))
    assert seen["0"] not in ("203.0.113.66", proxy_ip, None), seen  # the real client, as HAProxy saw it
    assert seen["1"] == seen["0"], seen  # the malformed header: the same real client
    assert seen["2"] == container_ip(stack, worker), seen  # not through the proxy: the peer itself

    # -- production refuses a public SECRET_KEY (item 5), with the sentence that says why
    web = stack.container("web")
    refused = stack.podman("exec", "-e", "SECRET_KEY=change-me", web, "cleverthis", "manage", "check")
    assert refused.returncode != 0
    assert "Refusing to start with DEBUG off: SECRET_KEY is a published example" in refused.stderr

    # -- the peer listener holding the tunnel bounds unauthenticated connections (item 6)
    peer = stack.shell(f'from fleet.models import Node; print(Node.objects.get(pk="{node.node_id}").tunnel_peer)')
    host, port = peer.rsplit(":", 1)
    cap = stack.shell("from django.conf import settings; print(settings.TUNNEL_PEER_MAX_PENDING)")
    probed = stack.podman("exec", worker, "python", "-c", PEER_PROBE, host, port, cap, timeout=300)
    assert probed.returncode == 0, probed.stderr
    assert json.loads(probed.stdout) == {
        "oversized_closed": True,
        "silent_open_meanwhile": True,
        "extra_closed": True,
        "waiting_open_meanwhile": int(cap),
        "waiting_dropped_later": int(cap),
    }
    # the tunnel and its process are untouched
    assert node_status(stack, node) == "online"
    assert dispatch_and_wait(stack, node.node_id, "acme/after-peer-probe") == "succeeded", node.agent.log()[-2000:]


def test_a_killed_worker_comes_back_and_dispatches_again(stack: Stack, node: JoinedNode):
    kill_and_see_it_restarted(stack, stack.container("worker"))
    started = time.monotonic()
    assert dispatch_and_wait(stack, node.node_id, "acme/again") == "succeeded", node.agent.log()[-2000:]
    print(f"a command after the worker's restart took {time.monotonic() - started:.1f} s")


def test_an_endpoint_answers_on_its_https_origin_and_streams_unbuffered(stack: Stack, node: JoinedNode):
    assert dispatch_and_wait(stack, node.node_id, "acme/chat") == "succeeded"
    made = json.loads(start_endpoint(stack, node.node_id, "acme/chat"))
    assert made["status"] == "running", made["failure"]
    url = made["url"]
    assert re.fullmatch(rf"https://endpoint-[0-9a-f]{{12}}\.endpoints\.localhost:{stack.port}", url), url
    auth = ["-H", f"Authorization: Token {made['token']}"]

    # through HAProxy on the wildcard host, TLS verified against the local CA
    answered = subprocess.run(stack.curl(f"{url}/v1/models", "-w", "\n%{http_code}", *auth),
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    body, status = answered.stdout.rsplit("\n", 1)
    assert status == "200", answered.stdout + answered.stderr
    assert json.loads(body)["data"][0]["id"] == "acme/chat"
    anonymous = subprocess.run(stack.curl(f"{url}/v1/models", "-o", "/dev/null", "-w", "%{http_code}"),
                               capture_output=True, text=True, timeout=60)  # fmt: skip
    assert anonymous.stdout == "401"

    # SSE: the stand-in holds the last word until the gate exists, and only the first event opens it, so
    # a hop that buffered the stream would deliver nothing before curl gives up
    slug = url.split("//endpoint-", 1)[1].split(".", 1)[0]
    served = json.loads((node.state / "work" / "endpoints" / "endpoints.json").read_text())[slug]
    assert "--stream-gate" in psutil.Process(served["pid"]).cmdline()
    question = {"model": "acme/chat", "stream": True, "messages": [{"role": "user", "content": "hello through tls"}]}
    argv = stack.curl(f"{url}/v1/chat/completions", "--max-time", "45", *auth,
                      "-H", "Content-Type: application/json", "--data", json.dumps(question))  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as stream:
        assert stream.stdout is not None
        assert stream.stderr is not None
        first = stream.stdout.readline()
        assert first.startswith(b"data: "), (first, stream.stderr.read())
        node.stream_gate.touch()
        rest = stream.stdout.read()
    events = [line[6:] for line in (first + rest).splitlines() if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    words = [json.loads(event)["choices"][0]["delta"].get("content", "") for event in events[:-1]]
    assert "".join(words) == "echo: hello through tls"


@needs_chromium
def test_a_browser_signs_in_over_https_and_gets_host_cookies(stack: Stack, node: JoinedNode):
    # Chromium trusts the stack's certificate by its public key (no system trust store is changed here)
    cert = x509.load_pem_x509_certificate((stack.ca.parent / "server.pem").read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    pin = base64.b64encode(hashlib.sha256(spki).digest()).decode()
    with chromium(f"--ignore-certificate-errors-spki-list={pin}") as browser:
        page = browser.new_page()
        page.set_default_timeout(20000)
        page.goto(f"{stack.url}/accounts/login/")
        page.fill("input[name=username]", "admin")  # bootstrap_demo's user
        page.fill("input[name=password]", "admin")
        with page.expect_response(lambda r: r.request.method == "POST") as posted:
            page.click("button[type=submit]")
        page.wait_for_url(f"{stack.url}/")
        assert "admin" in page.content()
        set_cookies = [h["value"] for h in posted.value.headers_array() if h["name"].lower() == "set-cookie"]
        cookies = {c["name"]: c for c in page.context.cookies()}
    assert set(cookies) >= {"__Host-sessionid", "__Host-csrftoken"}, cookies
    for cookie in cookies.values():
        assert cookie["secure"], cookie
        assert cookie["path"] == "/", cookie
        assert cookie["domain"] == "localhost", cookie  # host-only: no Domain attribute
    session = next(c for c in set_cookies if c.startswith("__Host-sessionid="))
    attributes = {part.strip().split("=")[0].lower() for part in session.split(";")[1:]}
    assert {"secure", "path", "httponly"} <= attributes, session
    assert "domain" not in attributes, session
    assert "Path=/;" in session + ";"


def test_killed_web_replicas_come_back_and_commands_flow_again(stack: Stack, node: JoinedNode):
    tunnels = node.tunnels()
    for number in (1, 2):  # the agent's tunnel is on one of them: it reconnects to the other
        web = stack.container("web", number)
        kill_and_see_it_restarted(stack, web)
        assert dispatch_and_wait(stack, node.node_id, f"acme/after-web-{number}") == "succeeded", stack.logs()
        wait_healthy(stack, web)
        time.sleep(6)  # HAProxy checks every 5 s: it sends connections to the replica again before the next kill
    assert node.tunnels() > tunnels, node.agent.log()[-2000:]
    assert node_status(stack, node) == "online"
    print(f"tunnel back after a replica's kill in {reconnect_gaps(node.agent.log())[-1]:.1f} s")


def test_the_roll_replaces_every_process_and_moves_the_tunnel_exactly_once(stack: Stack, node: JoinedNode):
    before: dict[str, Any] = {s: stack.names(s) for s in ("web", "worker", "beat")}
    ids = {n: stack.podman("inspect", "--format", "{{.Id}}", n).stdout.strip() for ns in before.values() for n in ns}
    log_before = node.agent.log()
    offline = offline_events(stack, node)
    # a new release: the image under a tag of its own, pinned in the settings file (docs/deploy.md)
    release = stack.setting("CONTROL_PLANE_IMAGE").rsplit(":", 1)[0] + f":{stack.project}"
    assert stack.podman("tag", stack.setting("CONTROL_PLANE_IMAGE"), release).returncode == 0
    stack.change_setting("CONTROL_PLANE_IMAGE", release)
    try:
        rolled = subprocess.run(
            ["bash", str(COMPOSE_DIR / "roll"), "--env-file", str(stack.env_file), "-p", stack.project],
            env={**stack.env, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert rolled.returncode == 0, rolled.stderr[-3000:] + stack.logs()
        # the same replica names, every one a new container of the new release
        assert {s: stack.names(s) for s in before} == before
        for name, old in ids.items():
            assert stack.podman("inspect", "--format", "{{.Id}}", name).stdout.strip() != old, name
            assert stack.podman("inspect", "--format", "{{.ImageName}}", name).stdout.strip() == release, name
    finally:
        stack.podman("untag", release, release)  # the containers keep the image itself
    # the tunnel moved exactly once, make-before-break: asked to move, one new tunnel, never without one
    during = node.agent.log()[len(log_before) :]
    assert during.count("asked this tunnel to move") == 1, during[-3000:]
    assert during.count("connected to ") == 1, during[-3000:]
    assert "reconnecting in" not in during, during[-3000:]
    assert "cannot connect" not in during, during[-3000:]
    assert "the tunnel that moved closed: control plane closed the tunnel: 1000" in during, during[-3000:]
    # the node never went offline, and commands flow after the roll
    assert offline_events(stack, node) == offline, during[-3000:]
    assert node_status(stack, node) == "online"
    assert dispatch_and_wait(stack, node.node_id, "acme/after-roll") == "succeeded", node.agent.log()[-2000:]
    print("the roll moved the tunnel once:", [line for line in during.splitlines() if "move" in line])
