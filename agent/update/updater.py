"""One agent update: fetch the package, check it, install it beside the running version, switch, roll back.

`prepare` runs in the old version: it downloads the package from the control plane's own origin,
checks its SHA-256 against the digest the control plane's CA signed (verified with the CA pinned at
join: a stolen or replaced download cannot push code), unpacks it into `versions/<version>/`, writes the
`trial` marker and points `current` at it. The process then restarts (`agent.update.launch`).

The new version confirms once it has connected (`confirm`: the command's result is journaled before any
re-sent command is looked at); if it has not by the deadline, `rollback` points `current` back,
journals the command's error and restarts into the previous version, which answers the re-sent command
from the journal. So the command finishes exactly once, with the outcome of the update.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import urllib.request
from pathlib import Path

from agent import identity
from agent import protocol as p
from agent.config import AgentConfig
from agent.errors import CommandFailed
from agent.journal import journal_append, journal_path
from agent.update.store import InstallError, UpdateMarker, VersionStore, now
from agent.update.version import agent_version

log = logging.getLogger("agent.update")
DOWNLOAD_TIMEOUT_S = 120.0
MAX_PACKAGE_BYTES = 256 * 1024 * 1024


def store_for(config: AgentConfig) -> VersionStore:
    return VersionStore(Path(config.state_dir) / "versions")


def journal_for(config: AgentConfig) -> Path:
    return journal_path(config.work_dir)


def _download(url: str, destination: Path) -> str:
    """Stream `url` into `destination`; its SHA-256 (hex)."""
    digest = hashlib.sha256()
    size = 0
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, destination.open("wb") as out:
        while chunk := response.read(1024 * 1024):
            size += len(chunk)
            if size > MAX_PACKAGE_BYTES:
                raise CommandFailed("invalid_payload", f"the package is larger than {MAX_PACKAGE_BYTES} bytes")
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def prepare(config: AgentConfig, command: p.Command, payload: p.AgentUpdatePayload) -> UpdateMarker:
    """Download, verify and install `payload.version`, then switch to it; the `trial` marker written.

    Raises `CommandFailed` (nothing switched) when the signature, the digest or the package is wrong.
    """
    ca_pem = config.ca_path.read_text()
    if not identity.verify_package_signature(ca_pem, payload.version, payload.sha256, payload.signature_b64):
        raise CommandFailed("invalid_payload", "the update's signature does not verify with the pinned CA: refused")
    if not payload.path.startswith("/") or payload.path.startswith("//"):
        raise CommandFailed("invalid_payload", "the package path must be a path on the control plane")
    url = config.control_plane_url.rstrip("/") + payload.path
    store = store_for(config)
    store.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=store.root, prefix=".download-") as scratch:
        package = Path(scratch) / "package.tar.gz"
        try:
            sha256 = _download(url, package)
        except OSError as exc:
            raise CommandFailed("internal", f"cannot download the agent package from {url}: {exc}") from exc
        if sha256 != payload.sha256:
            raise CommandFailed(
                "invalid_payload", f"the downloaded package's SHA-256 {sha256} is not the signed {payload.sha256}"
            )
        try:
            installed = store.install(package, payload.version)
        except InstallError as exc:
            raise CommandFailed("invalid_payload", str(exc)) from exc
    previous = store.current_dir()
    marker = UpdateMarker(
        state="trial",
        from_version=agent_version(),
        from_dir=str(previous or ""),
        to_version=payload.version,
        key=command.idempotency_key,
        command_id=command.command_id,
        started_at=now(),
        deadline=now() + payload.rollback_after_s,
    )
    store.write_marker(marker)
    store.switch(installed)
    store.prune(keep={installed, *([previous] if previous else [])})
    log.info("agent %s installed in %s; switching over from %s", payload.version, installed, marker.from_version)
    return marker


def trial_of_this_version(config: AgentConfig) -> UpdateMarker | None:
    """The `trial` marker when this process is the version on trial."""
    marker = store_for(config).marker()
    if marker is not None and marker.state == "trial" and marker.to_version == agent_version():
        return marker
    return None


def confirm(config: AgentConfig, marker: UpdateMarker) -> p.Result:
    """The new version connected: the update succeeded. Marker confirmed; the command's result returned
    (the caller journals it through its runner before handling any command)."""
    seconds = round(now() - marker.started_at, 2)
    store_for(config).write_marker(_moved(marker, "confirmed"))
    log.info("agent update to %s confirmed: connected %.1fs after the update started", marker.to_version, seconds)
    result = p.AgentUpdateResult(version=marker.to_version, previous_version=marker.from_version, seconds=seconds)
    return p.Result(command_id=marker.command_id, data=p.result_to_dict(result))


def rollback(config: AgentConfig, marker: UpdateMarker, reason: str) -> None:
    """The new version failed: point `current` back, journal the command's error, mark it rolled back."""
    store = store_for(config)
    previous = Path(marker.from_dir) if marker.from_dir else None
    store.switch(previous if previous is not None and previous.is_dir() else None)
    message = f"agent {marker.to_version} {reason}: rolled back to {marker.from_version}"
    data = {"version": marker.to_version, "previous_version": marker.from_version, "rolled_back": True}
    error = p.Error(command_id=marker.command_id, code="internal", message=message, data=data)
    journal_append(journal_for(config), marker.key, "agent.update", error)
    store.write_marker(_moved(marker, "rolled_back", reason))
    log.error("%s", message)


def _moved(marker: UpdateMarker, state: str, reason: str = "") -> UpdateMarker:
    return UpdateMarker(**{**marker.__dict__, "state": state, "reason": reason})
