"""Node origins are named in the core (`fleet.origin_names`): hosts from ids, ids from hosts, shown URLs."""

from __future__ import annotations

import uuid

from fleet import origin_names


def test_each_kind_names_a_host_and_reads_the_id_back(settings):
    settings.ENDPOINT_DOMAIN, settings.RAY_DASHBOARD_DOMAIN = "Endpoints.Example.com.", "ray.example.com"
    ident = str(uuid.uuid4())
    assert origin_names.ENDPOINT.host("0123456789ab") == "endpoint-0123456789ab.endpoints.example.com"
    assert origin_names.ENDPOINT.ident("endpoint-0123456789ab.endpoints.example.com") == "0123456789ab"
    assert origin_names.SERVE.ident(origin_names.SERVE.host(ident)) == ident
    assert origin_names.DASHBOARD.host(ident) == f"ray-{ident}.ray.example.com"
    assert origin_names.DASHBOARD.ident(f"ray-{ident}.ray.example.com") == ident


def test_a_host_of_another_kind_or_domain_names_nothing(settings):
    settings.ENDPOINT_DOMAIN, settings.RAY_DASHBOARD_DOMAIN = "endpoints.localhost", "ray.localhost"
    ident = str(uuid.uuid4())
    assert origin_names.DASHBOARD.ident(f"serve-{ident}.endpoints.localhost") is None
    assert origin_names.ENDPOINT.ident("endpoint-0123456789ab.evil.localhost") is None
    assert origin_names.ENDPOINT.ident("endpoint-0123456789ab.endpoints.localhost.evil") is None
    assert origin_names.is_node_origin_host(f"ray-{ident}.ray.localhost")
    assert not origin_names.is_node_origin_host("localhost")


def test_the_shown_url_uses_the_configured_scheme_and_port(settings):
    settings.NODE_ORIGIN_SCHEME, settings.NODE_ORIGIN_PORT = "", ""
    assert origin_names.public_url("endpoint-x.endpoints.localhost") == "https://endpoint-x.endpoints.localhost"
    settings.NODE_ORIGIN_SCHEME, settings.NODE_ORIGIN_PORT = "http", "8000"
    assert origin_names.public_url("endpoint-x.endpoints.localhost") == "http://endpoint-x.endpoints.localhost:8000"
