"""Single sign-on settings: parsed from the environment, and a bad configuration stops the process at
start-up with the reason (never a 500 at the first sign-in)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cleverthis.settings.env import env_workspace_map, oidc_config_errors
from tests.support.processes import REPO_ROOT

ENDPOINTS = {
    "OIDC_AUTHORIZATION_ENDPOINT": "https://id.test/a",
    "OIDC_TOKEN_ENDPOINT": "https://id.test/t",
    "OIDC_USERINFO_ENDPOINT": "https://id.test/u",
    "OIDC_JWKS_ENDPOINT": "https://id.test/j",
}


def test_workspace_map_parses_triples(monkeypatch):
    monkeypatch.setenv("M", "fleet-admins=acme:Admin, fleet-users=acme:member,cn=x=y=globex:viewer")
    assert env_workspace_map("M") == (
        ("fleet-admins", "acme", "admin"),
        ("fleet-users", "acme", "member"),
        ("cn=x=y", "globex", "viewer"),
    )
    monkeypatch.delenv("M")
    assert env_workspace_map("M") == ()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("admins", "is not `<claim value>=<workspace slug>:<role>`"),
        ("admins=acme", "is not `<claim value>=<workspace slug>:<role>`"),
        ("=acme:admin", "is not `<claim value>=<workspace slug>:<role>`"),
        ("admins=ac me:admin", "is not a workspace slug"),
        ("admins=acme:boss", "role 'boss'"),
    ],
)
def test_a_malformed_workspace_map_is_refused_with_the_reason(monkeypatch, raw, message):
    monkeypatch.setenv("M", raw)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("`", "`")):
        env_workspace_map("M")


def test_config_errors():
    assert (
        oidc_config_errors(
            client_secret="s", discovery_url="https://id.test/.well-known/x", endpoints={}, sign_algo="RS256"
        )
        == []
    )
    assert oidc_config_errors(client_secret="s", discovery_url="", endpoints=ENDPOINTS, sign_algo="RS256") == []
    no_jwks = {k: v for k, v in ENDPOINTS.items() if k != "OIDC_JWKS_ENDPOINT"}
    assert oidc_config_errors(client_secret="s", discovery_url="", endpoints=no_jwks, sign_algo="HS256") == []
    errors = oidc_config_errors(client_secret="", discovery_url="", endpoints=no_jwks, sign_algo="RS256")
    assert errors == [
        "OIDC_CLIENT_SECRET is required with OIDC_CLIENT_ID",
        "without OIDC_ISSUER or OIDC_DISCOVERY_URL these are required: OIDC_JWKS_ENDPOINT",
    ]
    errors = oidc_config_errors(
        client_secret="s", discovery_url="id.test", endpoints={"OIDC_TOKEN_ENDPOINT": "ftp://x"}, sign_algo="none"
    )
    assert len(errors) == 3
    assert "OIDC_TOKEN_ENDPOINT must be an http(s) URL" in errors[1]
    assert "'none'" in errors[2]


def _start(**env: str) -> subprocess.CompletedProcess:
    """Load the settings in a fresh process, as every process of the control plane does at start-up."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("OIDC_")}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; print(settings.AUTHENTICATION_BACKENDS)",
        ],
        cwd=REPO_ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "cleverthis.settings.test", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_start_up_with_and_without_oidc():
    off = _start()
    assert off.returncode == 0
    assert "OidcBackend" not in off.stdout
    # configured with an issuer nobody answers at: the process starts (no network at import)
    on = _start(OIDC_CLIENT_ID="fleet", OIDC_CLIENT_SECRET="s", OIDC_ISSUER="http://127.0.0.1:9/")
    assert on.returncode == 0, on.stderr
    assert "tenancy.oidc.OidcBackend" in on.stdout
    bad = _start(OIDC_CLIENT_ID="fleet", OIDC_WORKSPACE_MAP="admins=acme:boss")
    assert bad.returncode != 0
    assert "OIDC_WORKSPACE_MAP: role 'boss'" in bad.stderr
    incomplete = _start(OIDC_CLIENT_ID="fleet", OIDC_CLIENT_SECRET="s")
    assert incomplete.returncode != 0
    assert "OIDC single sign-on is misconfigured: without OIDC_ISSUER or OIDC_DISCOVERY_URL" in incomplete.stderr
