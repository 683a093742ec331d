"""deploy/compose: the stack's shape, checked without a container engine (the e2e test runs it)."""

from __future__ import annotations

from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]


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
