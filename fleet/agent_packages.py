"""The agent package this control plane serves: its version, its file, and the CA's signature over it.

The package is built once per process from AGENT_PACKAGE_SOURCE_DIR (default: this checkout) by
`agent.install.build_agent_sdist`; its version (release + digest of the agent sources) is known without
building it. Agents only install a package whose SHA-256 the CA signed (`agent.protocol.agent_package_message`),
so whoever can fetch or replace the download cannot push code.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings

from agent import protocol
from agent.install import build_agent_sdist, package_version
from fleet import ca

_lock = threading.Lock()
_built: dict[str, ServedPackage] = {}
_versions: dict[str, str] = {}


@dataclass(frozen=True)
class ServedPackage:
    """The built sdist: where it lies, its version and its SHA-256 (hex)."""

    path: Path
    version: str
    sha256: str


def source_dir() -> Path:
    """The tree the package is built from (holding pyproject.toml, README.md and agent/)."""
    return Path(settings.AGENT_PACKAGE_SOURCE_DIR or settings.BASE_DIR)


def served_version() -> str:
    """The version of the agent package this control plane serves (computed once per process)."""
    key = str(source_dir())
    if key not in _versions:
        _versions[key] = package_version(source_dir())
    return _versions[key]


def served_package() -> ServedPackage:
    """The package nodes download, built on first use (once per process and source tree)."""
    key = str(source_dir())
    with _lock:
        package = _built.get(key)
        if package is None or not package.path.exists():
            path = build_agent_sdist(project_dir=source_dir(), output_dir=Path(settings.AGENT_PACKAGE_CACHE_DIR))
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            package = ServedPackage(path=path, version=package_version(source_dir()), sha256=digest)
            _built[key] = package
        return package


def package_signature(package: ServedPackage) -> str:
    """Base64 CA signature (ECDSA-SHA256) over `agent_package_message(version, sha256)`."""
    message = protocol.agent_package_message(package.version, package.sha256)
    return base64.b64encode(ca._load_ca().key.sign(message, ec.ECDSA(hashes.SHA256()))).decode("ascii")
