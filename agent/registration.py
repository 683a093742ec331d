"""`agent join`: register this machine with a join token and store its identity under the state dir."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import requests

from agent import identity, inventory
from agent.config import CA_FILE, CERT_FILE, NODE_FILE, AgentConfig
from agent.errors import RegistrationError
from agent.protocol import HostFacts, to_dict

log = logging.getLogger("agent.registration")
REGISTER_PATH = "/api/v1/agent/register"


# Said with every refused token: what the operator can do about it.
NEW_TOKEN_HINT = (
    "a join token works once and expires 24 hours after it is made: generate a new one "
    "(the cluster's Commands tab, Generate Join Token) and run the join command it shows"
)


def _error_message(response: requests.Response) -> str:
    """The control plane's refusal as one line (error bodies are JSON; anything else is cut short)."""
    try:
        body: Any = response.json()
    except ValueError:
        return " ".join(response.text.split())[:300]
    if isinstance(body, dict):
        parts = []
        for field, messages in body.items():
            if field == "code":
                continue
            text = "; ".join(map(str, messages)) if isinstance(messages, list) else str(messages)
            parts.append(text if field in ("detail", "non_field_errors", "token") else f"{field}: {text}")
        return " ".join(" ".join(parts).split())
    return str(body)


def _refusal(response: requests.Response) -> str:
    """Why the control plane refused to register this machine, and what to do, in one line."""
    message = _error_message(response)
    try:
        code = response.json().get("code", "")
    except (ValueError, AttributeError):
        code = ""
    if isinstance(code, str) and code.startswith("token_"):
        if "generate a new one" in message:  # the control plane said what to do
            return f"the control plane refused the join token: {message.rstrip('.')}"
        return f"the control plane refused the join token: {message.rstrip('.')}; {NEW_TOKEN_HINT}"
    if response.status_code == 404:
        return f"{response.url} does not exist (HTTP 404): is {response.url.split('/api/')[0]} the control plane's URL?"
    return f"registration refused (HTTP {response.status_code}): {message}"


def _unreachable(url: str, exc: requests.RequestException) -> str:
    """`cannot reach …` with the innermost reason (urllib3 nests it several exceptions deep)."""
    reason: BaseException = exc
    for _ in range(10):
        inner = getattr(reason, "reason", None)
        if inner is None and reason.args and isinstance(reason.args[0], BaseException):
            inner = reason.args[0]
        if not isinstance(inner, BaseException):
            break
        reason = inner
    text = str(reason)
    if "Failed to establish a new connection: " in text:
        text = text.split("Failed to establish a new connection: ", 1)[1]
    text = " ".join(text.split())
    return f"cannot reach the control plane at {url} ({text}): check that this machine can connect to it"


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
        raise RegistrationError(_unreachable(url, exc)) from exc
    if response.status_code != 201:
        raise RegistrationError(_refusal(response))
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
