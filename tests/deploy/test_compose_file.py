"""deploy/compose: the stack's shape, checked without a container engine (the e2e test runs it).

The file is also validated against the Compose Specification's JSON schema (the one Docker Compose
validates with), as vendored by check-jsonschema: Docker Compose itself does not run here.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]


def compose_spec_errors(document: dict[str, Any]) -> list[str]:
    """What the Compose Specification's schema finds wrong in `document` (empty: valid)."""
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    schema = json.loads(vendored.read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_the_file_follows_the_compose_specification():
    assert compose_spec_errors(COMPOSE) == []
    # the schema is strict: a key Docker Compose does not know fails
    misspelled = copy.deepcopy(COMPOSE)
    misspelled["services"]["web"]["restart_policy"] = "always"
    assert any("restart_policy" in error for error in compose_spec_errors(misspelled))


def test_one_migrate_step_several_web_replicas_one_worker_exactly_one_beat():
    assert SERVICES["migrate"]["command"] == ["migrate"]
    assert SERVICES["migrate"]["restart"] == "no"
    assert SERVICES["web"]["deploy"] == {"mode": "replicated", "replicas": 2}
    for single in ("worker", "beat"):
        assert "deploy" not in SERVICES[single]
        assert "scale" not in SERVICES[single]
    assert [s for s, d in SERVICES.items() if d.get("command") == ["beat"]] == ["beat"]


def test_long_running_services_restart_and_declare_health_checks():
    for name, service in SERVICES.items():
        if name in ("migrate",):
            continue
        assert service["restart"] == "always", name
        if name != "beat":  # beat serves nothing to check; its schedule shows in the worker's tasks
            assert service["healthcheck"]["test"][0] == "CMD", name


def test_redis_keeps_an_append_only_file_and_postgres_a_volume():
    assert SERVICES["redis"]["command"] == ["redis"]
    entrypoint = (DEPLOY / "image" / "stack-entrypoint.sh").read_text()
    assert "--appendonly yes" in entrypoint
    assert "redisdata:/var/lib/redis" in SERVICES["redis"]["volumes"]
    assert "pgdata:/var/lib/postgresql/data" in SERVICES["postgres"]["volumes"]


def test_dependencies_name_only_services_without_dependencies_of_their_own():
    """podman 4.3 cannot start a container whose --requires have requirements of their own."""
    for name, service in SERVICES.items():
        for dependency in service.get("depends_on", {}):
            assert not SERVICES[dependency].get("depends_on"), f"{name} -> {dependency}"


def test_proxy_serves_tls_for_the_control_plane_and_wildcard_node_origins():
    proxy = SERVICES["proxy"]
    assert any(port.endswith(":8443") for port in proxy["ports"])
    assert set(proxy["environment"]) == {"CONTROL_PLANE_HOST", "ENDPOINT_DOMAIN", "RAY_DASHBOARD_DOMAIN"}
    config = (DEPLOY / "compose" / "haproxy.cfg").read_text()
    assert "bind :8443 ssl crt" in config
    assert '"${CONTROL_PLANE_HOST}"' in config
    assert '".${ENDPOINT_DOMAIN}" ".${RAY_DASHBOARD_DOMAIN}"' in config
    assert "timeout tunnel" in config  # upgraded connections: the agents' tunnels
    assert "server-template web" in config
    assert "resolvers compose" in config
    env = SERVICES["web"]["environment"]
    assert env["HTTPS_COOKIES"] == "1"
    assert env["NODE_ORIGIN_SCHEME"] == "https"


def test_web_replicas_listen_for_peer_links_on_the_compose_network():
    """A proxied request on one replica opens its stream at the replica holding the tunnel: the others
    must reach its peer listener, so it binds every interface (advertising its container's address)."""
    assert SERVICES["web"]["environment"]["TUNNEL_PEER_BIND"] == "0.0.0.0"
    for single in ("worker", "beat"):
        assert "TUNNEL_PEER_BIND" not in SERVICES[single]["environment"]


def test_the_proxy_replaces_a_client_sent_forwarded_for_and_web_believes_the_proxy_alone():
    """A forged X-Forwarded-For must not survive HAProxy (option forwardfor would append to it), and web
    takes the client from the header only when HAProxy sent it (TRUSTED_PROXIES names the proxy service)."""
    config = (DEPLOY / "compose" / "haproxy.cfg").read_text()
    directives = [line.split("#")[0].strip() for line in config.splitlines()]
    assert "http-request set-header X-Forwarded-For %[src]" in directives
    assert not any(d.startswith("option forwardfor") for d in directives)
    assert SERVICES["web"]["environment"]["TRUSTED_PROXIES"] == "proxy"
    assert "proxy" in SERVICES
    entrypoint = (DEPLOY / "image" / "entrypoint.sh").read_text()
    assert "--no-proxy-headers" in entrypoint
    assert "--forwarded-allow-ips" not in entrypoint


def _haproxy_backend(name: str) -> list[str]:
    """The directives of HAProxy's backend `name` (comments left out), one a line."""
    lines, inside = [], False
    for raw in (DEPLOY / "compose" / "haproxy.cfg").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if raw and not raw[0].isspace():
            inside = line == f"backend {name}"
            continue
        if inside and line:
            lines.append(line)
    return lines


def _seconds(value: str) -> float:
    return float(value[:-2]) / 1000 if value.endswith("ms") else float(value.rstrip("s"))


def test_a_draining_replica_leaves_haproxy_fast_and_requests_that_could_not_start_are_retried_elsewhere():
    """docs/deploy.md (Upgrades): a replica asked to stop fails /healthz at once; HAProxy's checks take it
    out within its WEB_DRAIN_LB_S, never prefer it, and send a request that found no answer elsewhere."""
    backend = _haproxy_backend("web")
    config = (DEPLOY / "compose" / "haproxy.cfg").read_text()
    assert "option redispatch" in config
    (retry_on,) = [line for line in backend if line.startswith("retry-on ")]
    assert {"conn-failure", "empty-response", "503"} <= set(retry_on.split()[1:])
    # only requests that are safe to send twice are retried after they were sent
    assert "http-request disable-l7-retry unless { method GET HEAD OPTIONS }" in backend
    assert "http-check expect status 200" in backend
    (server,) = [line for line in backend if line.startswith("default-server ")]
    words = server.split()
    inter = _seconds(words[words.index("inter") + 1])
    fall = int(words[words.index("fall") + 1])
    drain_lb_s = float(SERVICES["web"]["environment"]["WEB_DRAIN_LB_S"].split(":-")[1].rstrip("}"))
    assert inter * fall < drain_lb_s  # out of HAProxy before the replica moves its tunnels
    assert "on-marked-down" not in server  # open tunnels and streams are never cut by the checks


def test_web_replicas_get_the_time_to_drain_before_a_hard_stop():
    web = SERVICES["web"]
    deadline = float(web["environment"]["WEB_DRAIN_DEADLINE_S"].split(":-")[1].rstrip("}"))
    grace = _seconds(web["stop_grace_period"])
    assert grace > 2 * deadline  # the drain, then uvicorn's graceful shutdown of what still runs
    entrypoint = (DEPLOY / "image" / "entrypoint.sh").read_text()
    assert '--timeout-graceful-shutdown "${WEB_DRAIN_DEADLINE_S:-60}"' in entrypoint


def test_roll_drains_replicas_before_it_stops_them_and_rolls_the_worker_before_beat():
    """New replicas start (healthy) beside the old ones, the old ones drain once, all together (each tunnel
    moves once), the new ones take the old names, then the worker and beat are recreated."""
    roll = (DEPLOY / "compose" / "roll").read_text()
    steps = [line.strip() for line in roll.splitlines() if line.strip() and not line.strip().startswith("#")]
    drain_calls = [i for i, line in enumerate(steps) if line.startswith('drain "${')]
    assert [steps[i] for i in drain_calls] == ['drain "${old[@]}"']
    surge = next(i for i, line in enumerate(steps) if "--scale" in line and "web=" in line)
    healthy_surge = next(i for i, line in enumerate(steps) if line.startswith('healthy "${surge[@]}"'))
    rename = next(i for i, line in enumerate(steps) if line.startswith("podman rename"))
    assert surge < healthy_surge < drain_calls[0] < rename
    assert not any(line.startswith("podman stop -t 30") for line in steps)  # no stop without a drain first
    body = roll[roll.index("drain() {") : roll.index("\n}", roll.index("drain() {"))]
    assert body.index("podman kill --signal TERM") < body.index("podman wait")
    worker = next(i for i, line in enumerate(steps) if "--no-deps worker" in line)
    beat = next(i for i, line in enumerate(steps) if "--no-deps beat" in line)
    assert max(drain_calls) < worker < beat
