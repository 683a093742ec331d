"""`agent join`: register this machine with a join token and store its identity under the state dir."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import requests

from agent import identity, inventory
from agent.config import CA_FILE, CERT_FILE, NODE_FILE, AgentConfig
from agent.protocol import HostFacts, to_dict

log = logging.getLogger("agent.registration")
REGISTER_PATH = "/api/v1/agent/register"


class RegistrationError(RuntimeError):
    """The control plane refused the join (bad/expired/used token, bad CSR) or could not be reached."""


def _error_message(response: requests.Response) -> str:
    try:
        body: Any = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        parts = []
        for field, messages in body.items():
            text = "; ".join(map(str, messages)) if isinstance(messages, list) else str(messages)
            parts.append(text if field in ("detail", "non_field_errors", "token") else f"{field}: {text}")
        return " ".join(parts)
    return str(body)


def join(
    *, url: str, token: str, state_dir: Path, facts: HostFacts | None = None, force: bool = False, timeout: float = 30
) -> AgentConfig:
    """Register with the control plane at `url` and write key, certificate, CA and node.json to `state_dir`."""
    if (state_dir / NODE_FILE).exists() and not force:
        raise RegistrationError(f"already registered ({state_dir / NODE_FILE} exists); use --force to re-register")
    facts = facts or inventory.host_facts()
    key = identity.generate_key()
    csr_pem = identity.build_csr(key, facts.hostname)
    try:
        response = requests.post(
            url.rstrip("/") + REGISTER_PATH,
            json={"token": token, "csr_pem": csr_pem, "facts": to_dict(facts)},
            timeout=timeout,
        )
    except requests.RequestException as exc:
        raise RegistrationError(f"cannot reach the control plane at {url}: {exc}") from exc
    if response.status_code != 201:
        raise RegistrationError(f"registration refused ({response.status_code}): {_error_message(response)}")
    body = response.json()
    state_dir.mkdir(parents=True, exist_ok=True)
    identity.write_private_key(key, state_dir / "node.key")
    (state_dir / CERT_FILE).write_text(body["certificate_pem"])
    (state_dir / CA_FILE).write_text(body["ca_certificate_pem"])
    config = AgentConfig(
        control_plane_url=url.rstrip("/"),
        node_id=str(body["node_id"]),
        tunnel_path=body.get("tunnel_path", "/agent/tunnel"),
        heartbeat_interval_s=float(body.get("heartbeat_interval_s", 30)),
        state_dir=str(state_dir),
    )
    config.save()
    log.info("registered as node %s", config.node_id)
    return config
